"""Word timing: where each word of the caller's text lies in the audio (WordTimings events).

Two ways in, one per side:
- the engine: `alignment.py` (the GPT's alignment heads when it is built, what each decode step
  captures, an utterance's `TokenAlignment` at its end);
- the stream: `timeline.py` (an utterance's WordTimings event, the word ends a cut stops at,
  the caller's own text of an utterance).

Behind them: `calibration.py` chooses the heads, `capture.py` reads their attention from a
forward (torch, or what llama.cpp's tap in `engine/llamacpp_tap.py` found), `attention.py`
times words by the alignment and `estimate.py` by the duration model where there is none.
`types.py` holds what the parts share. This package imports neither the stream nor api/.
"""
