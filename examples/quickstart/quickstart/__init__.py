"""dp-quickstart: FedAvg with central DP on sklearn digits, with per-round epsilon from a PrivacyLedger."""
