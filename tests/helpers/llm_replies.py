"""Realistic voice-agent replies, as chat LLMs write them (markdown, paragraphs, lists, code,
links, emoji), and the token streams they arrive in. Shared by the text front end's unit tests
(test_markdown.py) and the end-to-end replay through the real server (test_llm_replies.py).

Each reply carries words that must be spoken (`says`, checked on UtteranceEnd.text) and words
that must not (`never`): the code of a fenced block, a URL's scheme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    name: str
    text: str
    says: tuple[str, ...]
    never: tuple[str, ...] = ()


ENGLISH = (
    Reply(
        "wifi_steps",
        "Sure! Here's how to reconnect:\n\n"
        "**Step 1:** Open the *Wi-Fi* settings.\n"
        "**Step 2:** Tap **Forget network**, then join it again.\n\n"
        "That usually fixes it 🙂",
        ("step one", "open the wi fi settings", "forget network", "usually fixes it"),
    ),
    Reply(
        "numbered_list",
        "## Your route\n\n"
        "1. Turn left onto *Main Street*.\n"
        "2. Continue for 200 m.\n"
        "3. Take the second exit at the roundabout\n\n"
        "> Drive carefully, the road is wet.",
        (
            "your route",
            "turn left onto main street",
            "two hundred meters",
            "second exit",
            "drive carefully",
        ),
    ),
    Reply(
        "code_block",
        "To install it, run `pip install chattts-stream` in a terminal:\n\n"
        "```bash\n"
        "pip install chattts-stream\n"
        "python -m chattts_server --port 50051\n"
        "```\n\n"
        "Then open the *playground* in your browser.",
        ("to install it, run pip install chattts", "then open the playground"),
        ("python", "port", "fifty thousand"),
    ),
    Reply(
        "links",
        "You can read the [full guide](https://example.com/docs/guide?ref=chat) or the FAQ at "
        "https://help.example.org/faq. For billing, e-mail billing@example.com or message "
        "@support_team. ![diagram](https://example.com/d.png)",
        (
            "full guide",
            "help dot example dot org slash faq",
            "billing at example dot com",
            "at support underscore team",
        ),
        ("https", "ref", "guide slash"),
    ),
    Reply(
        "table_and_rule",
        "Here are the options:\n\n"
        "| Plan | Price |\n"
        "|------|-------|\n"
        "| Basic | $5 |\n"
        "| Pro | $12 |\n\n"
        "---\n\n"
        "Let me know which one suits you.",
        ("plan, price", "basic, five dollars", "pro, twelve dollars", "which one suits you"),
    ),
    Reply(
        "emphasis_and_files",
        "I checked ***both*** files: `config.yaml` looks fine, but __report.pdf__ is ~~empty~~ "
        "missing. 🎉\n\n- Re-run the export\n- Then upload it again\n\nAnything else?",
        (
            "checked both files",
            "config dot yaml looks fine",
            "report dot pdf",
            "re run the export",
            "then upload it again",
            "anything else",
        ),
    ),
    Reply(
        "plain_paragraphs",
        "The meeting moved to 3:30 PM.\n\nI have updated your calendar, and I sent a note to "
        "the team. Is there anything else I can do?",
        ("three thirty p m", "updated your calendar", "anything else i can do"),
    ),
)

CHINESE = (
    Reply(
        "zh_steps",
        "好的！请按以下步骤操作：\n\n"
        "1. 打开**设置**。\n"
        "2. 选择 *Wi-Fi*，然后点击“忘记网络”。\n\n"
        "这样通常就能解决问题 😊",
        ("打开设置", "选择", "忘记网络", "通常就能解决问题"),
    ),
    Reply(
        "zh_code_switching",
        "我用 iPhone 15 拍了照片，然后在 ChatGPT 里打开了 **Voice Mode**。效果很好！",
        ("iphone", "十五", "chatgpt", "voice mode", "效果很好"),
    ),
    Reply(
        "zh_links",
        "详细说明请看[官方文档](https://example.com/docs)，或者访问 https://help.example.cn/faq 。"
        "有问题请发邮件到 support@example.com。",
        ("官方文档", "help 点 example 点 cn 斜杠 faq", "support 艾特 example 点 com"),
        ("https",),
    ),
    Reply(
        "zh_list_and_code",
        "## 今日安排\n\n- 上午十点开会\n- 下午写报告\n\n```python\nprint('hello')\n```\n\n"
        "> 记得带上电脑。",
        ("今日安排", "上午十点开会", "下午写报告", "记得带上电脑"),
        ("print", "hello"),
    ),
)

REPLIES = ENGLISH + CHINESE

MARKUP_WORDS = ("asterisk", "hash", "backtick", "underscore", "pipe")
"""Words a markdown reader would say if it read the markup (a handle's underscore is said)."""
MARKUP_SYMBOLS = "*#`_|[]()<>~!?:;\"'/\\"


def tokens(text: str) -> list[str]:
    """text as an LLM streams it: words with their leading space, markers and newlines apart,
    Chinese one or two characters a token."""
    pieces = re.findall(r"\n+|[ \t]*(?:\*\*|__|```|[A-Za-z]+|\d|[\u4e00-\u9fff]{1,2}|[^\s])", text)
    assert "".join(pieces) == text, "tokens must cover the text"
    return pieces
