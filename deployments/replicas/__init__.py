"""The model replicas: one Serve deployment per stateful model part (DiT, SP DiT, VAE, text encoder), and their session bookkeeping, compute thread and locks."""
