"""A WordPiece tokenizer shaped like ChatTTS's (bert-base-chinese plus ChatTTS control tokens).

Built from scratch with the `tokenizers` library for the random-weight dev assets: ordinary
tokens first, the ChatTTS control tokens last, as in the official vocabulary.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import BertTokenizerFast

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Order matters: core.py keeps refined-text tokens with id < id("[break_0]"), so the word-level
# controls the refiner may emit ([uv_break], [laugh], ...) sit before [break_0], and the
# prompt-only controls ([break_N], [Ebreak], [oral_N], [laugh_N], [speed_N]) after it.
CONTROL_TOKENS: tuple[str, ...] = (
    "[Stts]",
    "[Ptts]",
    "[spk_emb]",
    "[empty_spk]",
    "[Sbreak]",
    "[Pbreak]",
    "[uv_break]",
    "[v_break]",
    "[lbreak]",
    "[laugh]",
    *(f"[break_{i}]" for i in range(8)),
    "[Ebreak]",
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[speed_{i}]" for i in range(10)),
)

_FULLWIDTH_PUNCTUATION = "，。、！？：；“”‘’（）《》【】…—～"
# fmt: off
_ENGLISH_WORDS = (
    "the", "and", "to", "of", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "i", "his", "they", "be", "at", "one", "have", "this", "from", "or",
    "had", "by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
    "their", "time", "if", "will", "way", "about", "many", "then", "them", "hello", "world",
)
# fmt: on
# Frequent characters first so the tiny vocabulary still covers everyday Chinese text.
_COMMON_CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
    "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头"
    "面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向"
    "情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信"
    "北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难"
    "神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物"
    "台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指"
    "思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步"
    "完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双"
    "测试符串"
)

# Upstream's vocabulary size (bert-base-chinese's 21128 plus ChatTTS's additions).
OFFICIAL_VOCAB_SIZE = 21178


def _ordinary_tokens(num_tokens: int | None) -> list[str]:
    """Ordinary vocabulary: `num_tokens` entries, or the small built-in set when None."""
    candidates = [
        *BERT_SPECIAL_TOKENS,
        *string.punctuation,
        *string.digits,
        *string.ascii_lowercase,
        *(f"##{c}" for c in string.ascii_lowercase + string.digits),
        *_FULLWIDTH_PUNCTUATION,
        *_ENGLISH_WORDS,
        *_COMMON_CJK,
    ]
    tokens = list(dict.fromkeys(candidates))  # de-duplicated, first occurrence wins
    seen = set(tokens)
    if num_tokens is None:
        return tokens
    if num_tokens < len(tokens):
        raise ValueError(f"vocabulary of {num_tokens} is smaller than the base set ({len(tokens)})")
    code_point = 0x4E00
    while len(tokens) < num_tokens and code_point <= 0x9FFF:
        ch = chr(code_point)
        if ch not in seen:
            tokens.append(ch)
            seen.add(ch)
        code_point += 1
    unused = 0
    while len(tokens) < num_tokens:
        tokens.append(f"[unused{unused}]")
        unused += 1
    return tokens


def build_tokenizer(out_dir: Path, vocab_size: int | None) -> int:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`.

    `vocab_size` is the total including the control tokens (21178 for the official size);
    None builds the small test vocabulary. Returns the tokenizer's length.
    """
    num_ordinary = None if vocab_size is None else vocab_size - len(CONTROL_TOKENS)
    vocab = {token: i for i, token in enumerate(_ordinary_tokens(num_ordinary))}
    backend = Tokenizer(
        models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    )
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    tokenizer = BertTokenizerFast(
        tokenizer_object=backend,
        do_lower_case=True,
        tokenize_chinese_chars=True,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        additional_special_tokens=list(CONTROL_TOKENS),
    )
    if vocab_size is not None and len(tokenizer) != vocab_size:
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, wanted {vocab_size}")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir), legacy_format=False)
    return len(tokenizer)
