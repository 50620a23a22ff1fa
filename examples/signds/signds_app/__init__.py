"""signds-vs-fedavg: SignDS (sparse sign votes + MagRR, ε-LDP per round) against plain FedAvg."""
