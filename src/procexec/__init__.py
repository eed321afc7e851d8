"""procexec: reproduce "When LLMs Stop Following Steps" end to end."""

__version__ = "0.1.0"
SPEC_VERSION = "1.0"  # version of ../shared/docs/benchmark-spec.md this package implements
