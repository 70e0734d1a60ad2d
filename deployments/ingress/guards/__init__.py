"""Access and abuse limits: API keys and origins, per-key quotas, per-socket policy, connection caps, the failed-claim gate."""
