"""dp-sgd-opacus: DP-SGD clients (Opacus) with cumulative, server-side accounted epsilon."""
