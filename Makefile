# The two commands of the README: `make run` and `make test`.
GO ?= go
# Packages' tests run with the race detector; -timeout bounds a stuck test.
TESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: run test test-short bench generate vet

# A local three-region deployment on embedded defaults (embedded NATS,
# memory stores) with a load generator skewing demand between regions.
run:
	$(GO) run ./cmd/ration-local

# Installs redis-server when missing (and it can), then runs every test.
test:
	./scripts/test-deps
	$(GO) vet ./...
	$(GO) test $(TESTFLAGS) ./...

# Quick loop while developing: no race detector, short mode.
test-short:
	$(GO) test -short ./...

# Benchmarks with their baselines, one run per package.
bench:
	./scripts/test-deps
	$(GO) test -run '^$$' -bench . -benchmem ./...

generate:
	$(GO) generate ./...

vet:
	$(GO) vet ./...
