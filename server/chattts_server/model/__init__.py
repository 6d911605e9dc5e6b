"""ChatTTS assets, our Llama decode over a slot KV cache, vocoders."""
