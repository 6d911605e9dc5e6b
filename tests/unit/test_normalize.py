"""Text normalization for ChatTTS: a table of navigation and caption cases in English and
Chinese, the control-token rules, and the guarantee that no ASCII digit survives.

The server-side path (UtteranceEnd.text) is covered in test_text_streaming.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chattts_server.text import control_tokens
from chattts_server.text.normalize import TextNormalizer, language


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer()


ENGLISH = [
    # distances and speeds: "m" after a number is meters (navigation), not minutes
    ("Turn left in 200m.", "Turn left in two hundred meters."),
    ("In 200 m, turn right", "In two hundred meters, turn right"),
    ("then keep right for 1.5 km", "then keep right for one point five kilometers"),
    ("in 500 ft keep left", "in five hundred feet keep left"),
    ("Speed limit 60 km/h.", "Speed limit sixty kilometers per hour."),
    ("Speed limit 100 kph", "Speed limit one hundred kilometers per hour"),
    ("Limit 65 mph", "Limit sixty five miles per hour"),
    ("3-5 km ahead", "three to five kilometers ahead"),
    # exits and road names
    ("take exit 12B onto the M25", "take exit twelve B onto the M twenty five"),
    ("join the A4 toward Bath", "join the A four toward Bath"),
    ("Take the I-95 north", "Take the I ninety five north"),
    ("merge onto US-101", "merge onto US one oh one"),
    ("then the I-405", "then the I four oh five"),
    # a compass letter after a road is its direction; an exit's letter is read as a letter
    ("Take exit 12B toward I-95 N.", "Take exit twelve B toward I ninety five north."),
    ("merge onto US-101 S, then exit 4A", "merge onto US one oh one south, then exit four A"),
    ("keep left for I-405 NB", "keep left for I four oh five northbound"),
    ("take CA-1 N toward the coast", "take CA one north toward the coast"),
    # street words: St. and Dr. by context (a name before: Street, Drive; a name after: Saint,
    # Doctor), the others always
    ("Turn right onto Main St. then left", "Turn right onto Main Street then left"),
    ("Turn onto Main St. Then keep right", "Turn onto Main Street. Then keep right"),
    ("Continue toward St. Louis", "Continue toward Saint Louis"),
    ("St. Charles Ave. is ahead", "Saint Charles Avenue is ahead"),
    ("Turn left on 5th Ave.", "Turn left on fifth Avenue."),
    ("the hospital on 42nd St", "the hospital on forty second Street"),
    ("Dr. Lee's office on Elm Dr.", "Doctor Lees office on Elm Drive."),
    (
        "follow Sunset Blvd to Oak Rd., then Hwy 1",
        "follow Sunset Boulevard to Oak Road, then Highway one",
    ),
    ("Mt. Rainier exit", "Mount Rainier exit"),
    # times and dates
    ("At 10:30", "At ten thirty"),
    ("Arrive at 10:05", "Arrive at ten oh five"),
    ("Leave at 9am", "Leave at nine a m"),
    ("Meet at 10:30 pm", "Meet at ten thirty p m"),
    # ChatTTS cannot say an apostrophe (its normalizer drops it)
    ("It's 3:00", "Its three o clock"),
    ("Open at 14:00", "Open at fourteen hundred"),
    ("on 2024-03-05", "on the fifth of march twenty twenty four"),
    # phone numbers: digit by digit, a pause per group
    ("Call (555) 123-4567", "Call five five five, one two three, four five six seven"),
    ("Call +1 555 123 4567", "Call plus one, five five five, one two three, four five six seven"),
    ("Call 0800 123 456", "Call oh eight oh oh, one two three, four five six"),
    # decimals, percentages, currency, temperatures, ordinals
    ("about 3.14", "about three point one four"),
    ("30% chance of rain", "thirty percent chance of rain"),
    ("$4.50", "four dollars fifty"),
    ("only $0.50", "only fifty cents"),
    ("£12.99 each", "twelve pounds ninety nine each"),
    ("€3,50", "three euros fifty"),
    ("raised $5m", "raised five million dollars"),
    ("It is -3℃ outside", "It is minus three degrees Celsius outside"),
    ("between 5-10°C", "between five to ten degrees Celsius"),
    ("Take the 2nd left", "Take the second left"),
    ("the 21st exit", "the twenty first exit"),
    ("1,234 people", "one thousand two hundred and thirty four people"),
    # symbols and oddities
    ("No. 5", "number five"),
    ("open 24/7", "open twenty four seven"),
    ("version 2.0.1", "version two point zero point one"),
    ("Ｒｏｕｔｅ ６６", "Route sixty six"),
    ("COVID-19", "COVID nineteen"),
    # controls pass, brackets that are no control are read as text
    ("Hello [uv_break] world [laugh] 2 times", "Hello [uv_break] world [laugh] two times"),
    ("see [1] here", "see one here"),
]

CHINESE = [
    ("前方200米右转", "前方两百米右转"),
    ("前方500m左转", "前方五百米左转"),
    ("1.5公里后右转", "一点五公里后右转"),
    ("限速60km/h", "限速六十公里每小时"),
    ("限速60公里/小时", "限速每小时六十公里"),
    ("上午10:30出发", "上午十点三十分出发"),
    ("2024年3月5日", "二零二四年三月五日"),
    ("气温-3℃", "气温零下三摄氏度"),
    ("价格4.50元", "价格四元五角"),
    ("票价¥4.05", "票价四元零五分"),
    ("3.00元", "三元"),
    ("电话13812345678", "电话幺三八幺二三四五六七八"),
    ("拨打(010)12345678", "拨打零幺零，幺二三四五六七八"),
    ("拨打400-123-4567", "拨打四零零，幺二三，四五六七"),
    ("增长30%", "增长百分之三十"),
    ("第3个出口", "第三个出口"),
    ("从12B出口离开", "从十二B出口离开"),
    ("沿G4京港澳高速行驶", "沿G四京港澳高速行驶"),
    ("右转进入Main St.", "右转进入Main Street。"),
    ("共1,234人", "共一千二百三十四人"),
    ("前方200米 [uv_break] 右转", "前方两百米 [uv_break] 右转"),
]


@pytest.mark.parametrize("text, spoken", ENGLISH, ids=[t for t, _ in ENGLISH])
def test_english(normalize, text, spoken):
    assert normalize(text) == spoken


@pytest.mark.parametrize("text, spoken", CHINESE, ids=[t for t, _ in CHINESE])
def test_chinese(normalize, text, spoken):
    assert normalize(text) == spoken


def test_language_is_chinese_when_any_cjk_character_is_present():
    assert language("Turn left 200m") == "en"
    assert language("Turn left 前方 200m") == "zh"


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(
            list("0123456789 .,:-+/%$£€¥°℃()[]abcxyzKMmkhAB") + ["前", "米", "元", "年", "０", "٣"]
        ),
        max_size=40,
    )
)
def test_no_ascii_digit_ever_survives(text):
    assert not re.search(r"[0-9]", TextNormalizer()(text))


def test_structural_tokens_are_forbidden_and_documented_controls_allowed():
    for token in (
        "[uv_break]",
        "[v_break]",
        "[lbreak]",
        "[laugh]",
        "[break_7]",
        "[oral_9]",
        "[laugh_2]",
        "[speed_0]",
    ):
        assert control_tokens.is_allowed(token)
        control_tokens.check(f"a {token} b")
    for token in (
        "[Stts]",
        "[Ptts]",
        "[spk_emb]",
        "[empty_spk]",
        "[Sbreak]",
        "[Pbreak]",
        "[Ebreak]",
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[unused7]",
        "[break_8]",
        "[laugh_3]",
        "[speed_10]",
    ):
        assert control_tokens.is_forbidden(token)
        with pytest.raises(ValueError, match=re.escape(token)):
            control_tokens.check(f"a {token} b")
    assert control_tokens.first_forbidden("[1] [sic] [citation needed]") is None


def test_the_engine_drops_forbidden_tokens_that_got_past_the_api(normalize):
    assert normalize("go [Stts][spk_emb] now [lbreak]") == "go now [lbreak]"
