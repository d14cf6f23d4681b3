"""inferwatch alerts (grown by later issues)."""
