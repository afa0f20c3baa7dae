"""What a start observed and how it is kept: the evidence record, the run folder, checkpoint tables, /metrics,
throughput, host identity and promotion.json. Data: imports only the ground and the contract."""
