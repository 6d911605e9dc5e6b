"""ChatTTS assets: dev builds in the official layout, sha256 checks, shapes, loading, upstream parity."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_devtools.upstream import upstream_chat
from chattts_server.devmodel.assets import STAMP_FILE, build_dev_assets, variant_shapes
from chattts_server.devmodel.tokenizer import (
    CONTROL_TOKENS,
    OFFICIAL_VOCAB_SIZE,
    build_tokenizer,
)
from chattts_server.model.chattts_config import chattts_config, speaker_stat
from chattts_server.model.loader import load_chattts
from chattts_server.model.shapes import check_consistent, read_shapes
from chattts_server.model.verify import (
    OFFICIAL_FILES,
    file_sha256,
    official_sha256_map,
    resolve_model_dir,
    sha256_key,
    verify_assets,
)


def _files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _matching_sha_map(model_dir: Path) -> dict[str, str]:
    return {sha256_key(rel): file_sha256(model_dir / rel) for rel in OFFICIAL_FILES}


@pytest.fixture
def tiny_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model that a test may damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny"))


def test_layout_is_exactly_the_official_file_list(tiny_model_dir: Path) -> None:
    assert _files_under(tiny_model_dir / "asset") == {
        f.removeprefix("asset/") for f in OFFICIAL_FILES
    }
    # The official list and ChatTTS's sha256 map name the same files.
    assert {sha256_key(f) for f in OFFICIAL_FILES} == set(official_sha256_map())


def test_rebuild_reuses_the_cache(tiny_model_dir: Path) -> None:
    before = {f: (tiny_model_dir / f).stat().st_mtime_ns for f in OFFICIAL_FILES}
    assert build_dev_assets("tiny", tiny_model_dir.parent) == tiny_model_dir
    assert {f: (tiny_model_dir / f).stat().st_mtime_ns for f in OFFICIAL_FILES} == before


def test_build_is_deterministic_and_repairs_an_incomplete_cache(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    fresh = build_dev_assets("tiny", tmp_path)
    assert fresh == tmp_path / "tiny"
    assert _matching_sha_map(fresh) == _matching_sha_map(tiny_model_dir)
    left = [p.name for p in tmp_path.iterdir() if p.name not in ("tiny", ".tiny.lock")]
    assert not left, f"staging folders left behind: {left}"

    (fresh / "asset" / "Vocos.safetensors").unlink()
    assert build_dev_assets("tiny", tmp_path) == fresh
    assert _matching_sha_map(fresh) == _matching_sha_map(tiny_model_dir)

    # A build from another recipe version is stale and gets replaced.
    (fresh / STAMP_FILE).write_text(json.dumps({"variant": "tiny", "recipe": -1}))
    build_dev_assets("tiny", tmp_path)
    assert json.loads((fresh / STAMP_FILE).read_text())["recipe"] != -1


def test_builders_at_once_build_once_and_keep_the_first_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh clone's test workers all build the tiny model at once: one builds, the others wait
    and reuse it. A second build published over the first would move it away from under a
    server already reading it (CI saw one fail to load its tokenizer)."""
    from chattts_server.devmodel import assets

    real_write = assets._write_assets
    builds: list[int] = []
    all_waiting = threading.Barrier(3)

    def counted_write(staging: Path, variant: str) -> None:
        builds.append(1)
        real_write(staging, variant)

    monkeypatch.setattr(assets, "_write_assets", counted_write)

    def build() -> Path:
        all_waiting.wait(60)
        return build_dev_assets("tiny", tmp_path)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: build(), range(3)))
    assert results == [tmp_path / "tiny"] * 3
    assert len(builds) == 1


def test_unknown_variant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dev asset variant"):
        build_dev_assets("huge", tmp_path)


def test_shapes_read_back_as_built(tiny_model_dir: Path) -> None:
    shapes = read_shapes(tiny_model_dir)
    num_text_tokens = shapes.embed.num_text_tokens
    assert shapes == variant_shapes("tiny", num_text_tokens)
    assert 200 < num_text_tokens < 1000
    assert shapes.eos_token_id == 625
    assert shapes.decoder.idim * 2 == shapes.gpt.hidden_size
    assert (shapes.vocos.n_fft, shapes.vocos.hop_length, shapes.vocos.n_mels) == (1024, 256, 100)
    check_consistent(shapes)
    # Either the model dir or its asset/ folder.
    assert read_shapes(tiny_model_dir / "asset") == shapes


def test_full_variant_has_the_official_shapes() -> None:
    """chattts_config(full shapes) reproduces ChatTTS's own default Config section by section."""
    from ChatTTS.config import Config

    official, ours = Config(), chattts_config(variant_shapes("full", OFFICIAL_VOCAB_SIZE))
    for section in ("gpt", "embed", "decoder", "dvae", "vocos"):
        assert dataclasses.asdict(getattr(ours, section)) == dataclasses.asdict(
            getattr(official, section)
        ), section
    assert ours.spk_stat == official.spk_stat


def test_inconsistent_shapes_are_refused(tiny_model_dir: Path) -> None:
    shapes = read_shapes(tiny_model_dir)
    bad = dataclasses.replace(shapes, decoder=dataclasses.replace(shapes.decoder, idim=32, odim=32))
    with pytest.raises(ValueError, match="Decoder"):
        check_consistent(bad)


def test_resolve_model_dir_accepts_both_forms(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir
    assert resolve_model_dir(tiny_model_dir / "asset") == tiny_model_dir
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(tmp_path)


def test_verify_assets_flags_dev_assets_against_the_official_map(tiny_model_dir: Path) -> None:
    problems = verify_assets(tiny_model_dir)
    assert problems == [f"{f}: sha256 mismatch" for f in OFFICIAL_FILES]


def test_verify_assets_passes_with_a_matching_map_and_catches_tampering(tiny_copy: Path) -> None:
    sha_map = _matching_sha_map(tiny_copy)
    assert verify_assets(tiny_copy, sha_map) == []
    assert verify_assets(tiny_copy / "asset", sha_map) == []

    vocos = tiny_copy / "asset" / "Vocos.safetensors"
    data = bytearray(vocos.read_bytes())
    data[-1] ^= 0x01
    vocos.write_bytes(bytes(data))
    (tiny_copy / "asset" / "gpt" / "config.json").unlink()
    assert verify_assets(tiny_copy, sha_map) == [
        "asset/Vocos.safetensors: sha256 mismatch",
        "missing asset/gpt/config.json",
    ]


def test_verify_assets_on_a_folder_without_assets(tmp_path: Path) -> None:
    assert verify_assets(tmp_path) == [f"missing {f}" for f in OFFICIAL_FILES]


def test_tokenizer_keeps_control_tokens_whole(tiny_model_dir: Path) -> None:
    from ChatTTS.model import Tokenizer

    tokenizer = Tokenizer(str(tiny_model_dir / "asset" / "tokenizer"))
    hf = tokenizer._tokenizer
    ids = hf.encode(
        "[Stts][spk_emb][speed_5]hello world[uv_break].[Ptts]", add_special_tokens=False
    )
    assert hf.convert_ids_to_tokens(ids) == [
        "[Stts]",
        "[spk_emb]",
        "[speed_5]",
        "hello",
        "world",
        "[uv_break]",
        ".",
        "[Ptts]",
    ]
    assert tokenizer.len == read_shapes(tiny_model_dir).embed.num_text_tokens
    # core.py keeps refined text tokens below [break_0]: ordinary text and word-level controls.
    control_ids = dict(
        zip(CONTROL_TOKENS, hf.convert_tokens_to_ids(list(CONTROL_TOKENS)), strict=True)
    )
    assert min(control_ids.values()) == tokenizer.len - len(CONTROL_TOKENS)
    for kept in ("[uv_break]", "[laugh]", "[lbreak]", "[v_break]"):
        assert control_ids[kept] < tokenizer.break_0_ids
    for dropped in ("[Ebreak]", "[oral_2]", "[laugh_0]", "[break_4]", "[speed_5]"):
        assert control_ids[dropped] >= tokenizer.break_0_ids
    assert tokenizer.eos_token == control_ids["[Ebreak]"]
    assert tokenizer.spk_emb_ids == control_ids["[spk_emb]"]


def test_full_size_tokenizer_has_the_official_length(tmp_path: Path) -> None:
    from transformers import BertTokenizerFast

    assert build_tokenizer(tmp_path, OFFICIAL_VOCAB_SIZE) == OFFICIAL_VOCAB_SIZE
    assert len(BertTokenizerFast.from_pretrained(str(tmp_path))) == OFFICIAL_VOCAB_SIZE
    assert _files_under(tmp_path) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }


def test_speaker_stats_fit_the_gpt_width() -> None:
    from ChatTTS.config import Config
    from ChatTTS.model import Speaker

    assert speaker_stat(768) == Config().spk_stat
    assert speaker_stat(128) == speaker_stat(128)
    speaker = Speaker(128, speaker_stat(128))
    assert speaker.std.shape == speaker.mean.shape == (128,)
    assert torch.isfinite(speaker._sample_random()).all()


def test_load_chattts_runs_the_pipeline(tiny_model_dir: Path) -> None:
    from transformers import LlamaModel

    rng_before = torch.get_rng_state()
    m = load_chattts(tiny_model_dir, torch.device("cpu"), torch.bfloat16)
    assert torch.equal(torch.get_rng_state(), rng_before), "loading consumed the caller's RNG"
    shapes = m.shapes
    assert m.model_dir == tiny_model_dir
    assert all(t.dtype == torch.bfloat16 for t in m.gpt_state_dict.values())
    assert next(m.embed.parameters()).dtype == torch.float32
    assert m.gpt_config.num_hidden_layers == shapes.gpt.num_layers
    assert not m.embed.training and not m.decoder.training and not m.vocos.training

    llama = LlamaModel(m.gpt_config)
    missing, unexpected = llama.load_state_dict(m.gpt_state_dict, strict=False)
    assert missing == ["embed_tokens.weight"] and unexpected == []

    # Tokens -> embeddings (speaker applied) -> Llama -> Decoder -> Vocos gives finite audio.
    text = m.normalizer("hello world.", True, True, None)
    prompt = m.speaker.decorate_code_prompts([text], "[speed_5]", None, "spk")
    input_ids, _, text_mask = m.tokenizer.encode(prompt, shapes.embed.num_vq)
    emb = m.embed(input_ids, text_mask)
    spk = m.speaker._sample_random()
    m.speaker.apply(emb, spk, input_ids, m.tokenizer.spk_emb_ids, torch.device("cpu"))
    with torch.inference_mode():
        hidden = llama.to(torch.float32)(inputs_embeds=emb).last_hidden_state  # (1, L, H)
        mel = m.decoder(hidden.transpose(1, 2).contiguous())  # (1, 100, 2L)
        audio = m.vocos.decode(mel)
    assert mel.shape == (1, 100, 2 * input_ids.shape[1])
    assert audio.shape == (
        1,
        (2 * input_ids.shape[1] - 1) * shapes.vocos.hop_length,
    )  # centred iSTFT
    assert torch.isfinite(audio).all() and 1e-3 < audio.abs().max() < 1.0

    # Reference-audio speakers go through the full DVAE (mel encoder + FSQ).
    codes = m.dvae.sample_audio(torch.randn(24000) * 0.1)
    assert codes.shape[0] == shapes.embed.num_vq
    assert int(codes.min()) >= 0 and int(codes.max()) < shapes.eos_token_id


def test_upstream_chat_infers_on_tiny(tiny_model_dir: Path) -> None:
    from ChatTTS import Chat
    from ChatTTS.config import Config

    chat = upstream_chat(tiny_model_dir)
    assert Config().gpt.hidden_size == 768, "patching the tiny config leaked into ChatTTS defaults"
    spk = chat.sample_random_speaker()

    params = Chat.InferCodeParams(
        spk_emb=spk,
        manual_seed=1,
        max_new_token=30,
        min_new_token=30,
        show_tqdm=False,
        stream_batch=12,  # yields after 12 and 24 tokens, then the rest
        pass_first_n_batches=0,
    )
    wavs = chat.infer(["hello world."], skip_refine_text=True, params_infer_code=params)
    audio = wavs[0]
    # 30 tokens -> 60 mel frames -> 15360 samples, less the near-silent samples infer strips.
    assert 10000 < audio.size <= 30 * 2 * 256
    assert np.isfinite(audio).all() and np.abs(audio).max() < 1.0

    chunks = list(
        chat.infer(["hello world."], stream=True, skip_refine_text=True, params_infer_code=params)
    )
    assert len(chunks) >= 3
    streamed = np.concatenate([c[0] for c in chunks])
    assert np.isfinite(streamed).all() and 10000 < streamed.size <= 30 * 2 * 256
