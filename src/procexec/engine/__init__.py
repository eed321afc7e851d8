"""How procexec drives vLLM, for the models stage (preparation) and the generation stage alike: the device, an
engine's arguments and what fits its KV pool, compile caches, the tokenizer and prompt renderer, the job server's
launch and supervision (docs/glossary.md: an engine is one vLLM engine)."""
