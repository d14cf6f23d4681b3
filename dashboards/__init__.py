"""inferwatch dashboards (grown by later issues)."""
