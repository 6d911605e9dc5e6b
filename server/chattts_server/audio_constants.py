"""The audio facts of a ChatTTS model that no weight file records: ChatTTS's fixed values, defined
once for the whole server.

Plain Python with no imports, so the text front end (duration estimates), the shapes reader,
the vocoders and the engine all read the same numbers. What a running server produces is
`engine.protocol.ModelInfo`, built from the vocoder in use: a HiFi-GAN checkpoint may have been
trained at another rate or hop.
"""

SAMPLE_RATE_HZ = 24000
"""Rate of the PCM ChatTTS's Vocos produces (and that its mel features were computed at)."""
HOP_LENGTH = 256
"""Samples per mel frame: the hop of Vocos's iSTFT and of the mel features."""
NUM_MELS = 100
"""Mel bands the ChatTTS Decoder produces and a vocoder reads."""
FRAMES_PER_TOKEN = 2
"""The Decoder reads each GPT hidden state as two consecutive mel-rate frames."""
SAMPLES_PER_TOKEN = FRAMES_PER_TOKEN * HOP_LENGTH
"""PCM samples one GPT step (audio token) becomes: 512."""
AUDIO_TOKENS_PER_S = SAMPLE_RATE_HZ / SAMPLES_PER_TOKEN
"""Audio tokens (GPT steps) per second of speech: 46.875."""
