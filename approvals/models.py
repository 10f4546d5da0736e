"""What humans do with held calls lives here; the held call itself is dispatch.Confirmation."""
