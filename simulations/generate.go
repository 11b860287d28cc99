// Package simulations holds ration's regional skew simulator: the sim
// package, the simulate command, and the scenarios. See README.md.
package simulations

//go:generate go run ./cmd/simulate -quiet -readme README.md scenarios/agent-churn.yaml scenarios/degraded-network.yaml scenarios/failover-lost-gift.yaml scenarios/flash-crowd.yaml scenarios/follow-the-sun.yaml scenarios/hot-key-zipf.yaml scenarios/many-small-keys.yaml scenarios/per-user.yaml scenarios/partition.yaml scenarios/policy-mismatch.yaml scenarios/partition-reclaim.yaml scenarios/redis-failover.yaml scenarios/regiond-outage.yaml scenarios/regiond-restart.yaml scenarios/rlqs-proxies.yaml scenarios/steady-uniform.yaml scenarios/steady-uniform-1h.yaml scenarios/sync-burst.yaml scenarios/minute-bucket-moving.yaml scenarios/ten-minute-quota.yaml scenarios/daily-window-moving.yaml scenarios/daily-window-busy.yaml scenarios/window-boundary.yaml
