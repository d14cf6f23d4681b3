"""inferwatch collector (grown by later issues)."""
