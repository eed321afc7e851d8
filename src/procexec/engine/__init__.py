"""The vLLM code that model preparation (stage 3) and generation (stage 4) share: device, engine arguments,
tokenizer, prompt renderer."""
