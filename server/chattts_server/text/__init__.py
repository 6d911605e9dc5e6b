"""Text on its way from a client to ChatTTS: when buffered text is released for synthesis
(`release`), how long it will take to say (`duration`), which inline control tokens may pass
(`control_tokens`) and how numbers, units and symbols are spelled out (`normalize`); where each
spoken word came from in the caller's text (`spans`, `words`) and when it is heard (`timing`).

Plain Python with no model or transport code, so every rule is unit-testable on its own.
"""
