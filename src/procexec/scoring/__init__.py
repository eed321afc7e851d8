"""Per-example scores from a generation and its reference: answer extraction, trace alignment, score files, a simulator."""
