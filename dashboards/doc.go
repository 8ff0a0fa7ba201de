// Package dashboards holds the Grafana dashboard over the driver's /metrics (elasticd.json)
// and the test that keeps its queries to the metrics the driver exports.
package dashboards
