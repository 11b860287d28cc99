# The two commands of the README: `make run` and `make test`.
GO ?= go
# Packages' tests run with the race detector; -timeout bounds a stuck test.
TESTFLAGS ?= -race -count=1 -timeout 30m
PERFTESTS = TestRefreshesAreBatched|TestEndToEndLongTail|TestBoundAndUtilisationUnderOverload|TestStoreOpsPerAdmittedAtSteadyState|TestEndToEndRegiondOnRedis|TestFault|TestColdKeysWhileDown|TestAllowIsAllocationFree

.PHONY: run test test-short bench generate vet scale faults

# A local three-region deployment on embedded defaults (embedded NATS,
# memory stores) with a load generator skewing demand between regions.
run:
	$(GO) run ./cmd/ration-local

# Installs redis-server when missing (and it can), then runs every test.
test:
	./scripts/test-deps
	$(GO) vet ./...
	$(GO) test $(TESTFLAGS) ./...
	# The race detector slows the load generators below the pace that the
	# agent's performance assertions (utilisation >= 95%, store operations
	# per admitted request, allocation-free decisions, recovery time) need,
	# so those tests skip them under -race; run them again without it.
	$(GO) test -count=1 -timeout 10m -run '$(PERFTESTS)' ./lease/agent
	# The client-IP extraction is what a spoofed header attacks, the policy
	# parser and the policy store's decoder read what operators and the
	# bucket give, the exchange's decoders what peers and the store give:
	# fuzz them.
	# Budgets in executions, about 10 s each here: a -fuzztime duration
	# races Go 1.26's fuzz coordinator at its deadline and fails with a bare
	# "context deadline exceeded" and no crasher (golang/go#75804, fixed in
	# Go 1.27; CI hit it on FuzzDecode).
	$(GO) test -run '^$$' -fuzz FuzzExtractor -fuzztime 60000x ./lease/agent/httplimit
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 100000x ./policy
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60000x ./policy/kvstore
	$(GO) test -run '^$$' -fuzz 'FuzzDecodeDifferential$$' -fuzztime 60000x ./sync/codec
	$(GO) test -run '^$$' -fuzz 'FuzzSnapshotRecord$$' -fuzztime 60000x ./sync/codec

# Quick loop while developing: no race detector, short mode.
test-short:
	$(GO) test -short ./...

# Benchmarks with their baselines, one run per package.
bench:
	./scripts/test-deps
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The scale run (issue 12), not part of test: three regiond, each on its own
# redis-server, over embedded NATS, with a million active keys for ten
# minutes, printing memory, CPU and NATS bytes per second every 30s, in
# regiond's grouped Redis layout (-redis-layout keys for the default one).
# Needs redis-server on PATH. Smaller: make scale SCALEFLAGS='-keys 10000 -duration 3m';
# -heap-profiles DIR writes every regiond's heap profile at the end.
scale:
	$(GO) run ./cmd/ration-scale $(SCALEFLAGS)

# The fault matrix (issue 18): one test per fault on real redis-server,
# redis-sentinel, embedded NATS (a three-server cluster for the route cut)
# and regiond processes, three regions under steady skewed load; prints
# one row per fault with its ratio admitted ÷ (L·W + B) and its recovery
# time. A few minutes; not part of test.
faults:
	./scripts/test-deps
	GO=$(GO) ./scripts/faults

generate:
	$(GO) generate ./...

vet:
	$(GO) vet ./...
