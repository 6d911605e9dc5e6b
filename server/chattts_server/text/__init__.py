"""Text on its way from a client to ChatTTS: when buffered text is released for synthesis
(`release`), how long it will take to say (`duration`), which inline control tokens may pass
(`control_tokens`) and how numbers, units and symbols are spelled out (`normalize`).

Plain Python with no model or transport code, so every rule is unit-testable on its own.
"""
