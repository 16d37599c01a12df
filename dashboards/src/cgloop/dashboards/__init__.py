"""NOC dashboards as code (grafana-foundation-sdk) and the check of their queries."""
