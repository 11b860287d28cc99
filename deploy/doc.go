// Package deploy holds no code: it is the home of the tests that check what
// operators deploy beside the binaries. They check that every metric the
// Grafana dashboard (grafana/ration.json) and the Prometheus alerts
// (prometheus/alerts.yaml) name is documented in docs/METRICS.md and that the
// table documents exactly what the code exports; run promtool on the alerts
// and the dashboard's queries; and check that the Dockerfile builds the
// binaries with the documented command (scripts/build), which they run to
// check that the binaries are static and start. See README.md.
package deploy
