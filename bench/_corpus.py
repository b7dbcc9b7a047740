"""A deterministic generator of realistic chat-gateway messages, for benchmarks.

``Corpus(seed).messages(n)`` yields ``n`` messages grouped in sessions (about
20 messages each, from telegram, discord, slack, cli and cron): user
questions, assistant answers, assistant tool calls (OpenAI shape, arguments
as a JSON string) and tool results.  About 10 % of the messages are Chinese
(whole sessions are), sometimes mixed with English technical words.  Word
frequencies follow a Zipf law over a real English head (``the`` is in most
English messages) and a long tail of made-up words (rare terms exist), and
fixed phrases (``connection refused``) recur in tool output.  The same seed
always gives the same messages, so benchmarks and designs can be compared.

Messages are plain tuples in ``FIELDS`` order, ready for ``executemany``;
sessions come from ``Corpus.sessions`` in the order their first message
appears.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from typing import Iterator

FIELDS = ("session_id", "role", "content", "tool_calls", "tool_name", "timestamp")
SESSION_FIELDS = ("id", "source", "model", "started_at")

#: Terms the search benchmark asks for, by how common they are in this corpus.
QUERIES = {
    "very common term": "the",
    "common term": "error",
    "rare term": "quixovant",
    "two terms": "docker restart",
    "phrase": '"connection refused"',
    "prefix": "deploy*",
    "CJK, 3 characters": "数据库",
}

_HEAD = (
    "the to and a of I you it is in that for this on with be can was have not are do what if my "
    "your we so but at as from or just there will how me an all about by would one like they know "
    "get use it's should then need here when also more now which don't could try make see any "
    "some out up new no first because only run other time want file work thanks yes sure check "
    "please let's way set using still into think last two also better good right back same"
).split()
_TECH = (
    "error docker restart deploy deployment deployed deploying server config database query python "
    "script function timeout container image build log logs request response api token user message "
    "bot channel webhook cache memory disk network port service install update version test tests "
    "failed success output input command terminal path directory permission kubernetes cluster node "
    "pod nginx proxy ssl certificate backup cron schedule job task queue worker thread process "
    "sqlite postgres redis index table column schema migration commit branch merge git github "
    "release package dependency module import exception traceback stack bug fix issue ticket "
    "telegram discord slack session model prompt context summary compression gateway latency "
    "throughput retry limit rate quota billing invoice customer account password login auth"
).split()
_PHRASES = [
    "connection refused", "permission denied", "no such file or directory", "timed out after 30 seconds",
    "exit code 1", "rate limit exceeded", "internal server error", "out of memory",
]
_SYLLABLES = "ka lo mi ven tor qua zel rin bo sa tix dra mon pel vor xi nu gar fle shi jor wex pru lan cy".split()
_RARE_WORD = "quixovant"  # planted with a small fixed probability, so the rare query finds a few dozen

_ZH_WORDS = (
    "我们 你 我 他 的 了 是 在 有 这个 那个 一下 可以 需要 问题 服务器 数据库 配置 部署 日志 错误 "
    "重启 容器 镜像 网络 端口 用户 消息 机器人 频道 会话 模型 记忆 上下文 压缩 总结 搜索 文件 目录 "
    "权限 测试 版本 更新 安装 依赖 任务 定时 队列 超时 连接 请求 响应 接口 令牌 缓存 内存 磁盘 "
    "今天 昨天 明天 现在 然后 因为 所以 但是 如果 已经 还是 怎么 为什么 什么 看看 帮我 检查 修复 "
    "谢谢 好的 没问题 明白 继续 完成 失败 成功 运行 执行 命令 脚本 函数 参数 结果 输出 输入"
).split()
_ZH_PUNCT = ["，", "。", "？", "！", "、"]
_ZH_MIXINS = ["docker", "API", "nginx", "Python", "SQLite", "token", "cron", "GPU"]

_SOURCES = [("telegram", 35), ("discord", 25), ("slack", 20), ("cli", 15), ("cron", 5)]
_MODELS = ["gpt-4o-mini", "qwen2.5-72b-instruct", "llama-3.1-70b", "deepseek-chat"]
_TOOLS = ["terminal", "web_search", "read_file", "write_file", "memory_search", "http_get"]


def _zipf_cum(n: int, s: float = 1.07) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, n + 1)))


@dataclass(frozen=True)
class Session:
    id: str
    source: str
    model: str
    started_at: float
    chinese: bool


class Corpus:
    """Deterministic messages; ``seed`` picks the stream, ``start`` the first timestamp."""

    def __init__(self, seed: int = 0, start: float = 1_700_000_000.0, tail_words: int = 40_000):
        self.rng = random.Random(seed)
        self.seed = seed
        self.clock = start
        gen = random.Random(12345)  # the vocabulary is the same for every seed
        tail = set()
        while len(tail) < tail_words:
            tail.add("".join(gen.choice(_SYLLABLES) for _ in range(gen.randint(2, 4))))
        tail.discard(_RARE_WORD)
        tail = sorted(tail)
        gen.shuffle(tail)
        head = list(dict.fromkeys(_HEAD + _TECH))
        # interleave: function words first, technical words spread through the top ranks, then the tail
        self.words = head + tail
        self.cum = _zipf_cum(len(self.words))
        self.zh_cum = _zipf_cum(len(_ZH_WORDS), 0.9)
        self.sessions: list[Session] = []
        self._n_sessions = 0

    # --- text ----------------------------------------------------------------

    def _english(self, lo: int, hi: int) -> str:
        rng = self.rng
        words = rng.choices(self.words, cum_weights=self.cum, k=rng.randint(lo, hi))
        if rng.random() < 0.0004:
            words[rng.randrange(len(words))] = _RARE_WORD
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice([".", "?", "", "!", "."])

    def _chinese(self, lo: int, hi: int) -> str:
        rng = self.rng
        n = rng.randint(lo, hi)
        words = rng.choices(_ZH_WORDS, cum_weights=self.zh_cum, k=n)
        out = []
        for i, w in enumerate(words):
            if rng.random() < 0.06:
                out.append(f" {rng.choice(_ZH_MIXINS)} ")
            out.append(w)
            if i and rng.random() < 0.12:
                out.append(rng.choice(_ZH_PUNCT))
        if rng.random() < 0.002:
            out.append("记忆断裂")
        return "".join(out) + "。"

    def _tool_output(self) -> str:
        rng = self.rng
        parts = [self._english(5, 130)]
        if rng.random() < 0.25:
            parts.insert(rng.randrange(2), f"Error: {rng.choice(_PHRASES)}")
        if rng.random() < 0.2:
            parts.append("\n".join(f"/srv/app/{rng.choice(self.words[:300])}.py:{rng.randint(1, 900)}"
                                   for _ in range(rng.randint(1, 4))))
        return "\n".join(parts)

    # --- stream --------------------------------------------------------------

    def _new_session(self) -> Session:
        rng = self.rng
        self._n_sessions += 1
        source = rng.choices([s for s, _ in _SOURCES], weights=[w for _, w in _SOURCES])[0]
        s = Session(
            id=f"{self.seed:02d}-{self._n_sessions:08d}",
            source=source,
            model=rng.choice(_MODELS),
            started_at=self.clock,
            chinese=rng.random() < 0.15,
        )
        self.sessions.append(s)
        return s

    def messages(self, n: int) -> Iterator[tuple]:
        """Yield ``n`` messages as tuples in ``FIELDS`` order."""
        rng = self.rng
        produced = 0
        while produced < n:
            s = self._new_session()
            length = max(2, int(rng.expovariate(1 / 20)))
            role = "user"
            for _ in range(length):
                if produced == n:
                    return
                self.clock += rng.expovariate(1 / 30)
                zh = s.chinese
                if role == "user":
                    row = (s.id, "user", self._chinese(4, 40) if zh else self._english(3, 50), None, None)
                    role = "assistant"
                elif role == "assistant" and rng.random() < 0.3:
                    tool = rng.choice(_TOOLS)
                    args = {"command" if tool == "terminal" else "query": self._english(2, 12)}
                    if zh and rng.random() < 0.5:
                        args["note"] = self._chinese(2, 8)
                    calls = [{"id": f"call_{rng.getrandbits(48):012x}", "type": "function",
                              "function": {"name": tool, "arguments": json.dumps(args)}}]
                    row = (s.id, "assistant", None, json.dumps(calls), None)
                    role = ("tool", tool)
                elif isinstance(role, tuple):
                    row = (s.id, "tool", self._tool_output(), None, role[1])
                    role = "assistant"
                else:
                    row = (s.id, "assistant", self._chinese(10, 140) if zh else self._english(15, 170), None, None)
                    role = "user"
                produced += 1
                yield row + (self.clock,)


if __name__ == "__main__":  # a quick look at the corpus: python -m bench._corpus
    import re
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    c = Corpus()
    rows = list(c.messages(n))
    text = [(r[2] or "") + " " + (r[3] or "") for r in rows]
    zh = sum(1 for t in text if re.search("[\u4e00-\u9fff]", t))
    print(f"{n} messages, {len(c.sessions)} sessions, {zh / n:.1%} with Chinese, "
          f"{sum(len(t.encode()) for t in text) / n:.0f} bytes of text per message")
    for q, term in QUERIES.items():
        words = term.strip('"*').lower()
        hits = sum(1 for t in text if words in t.lower())
        print(f"  {q:20} {term!r:25} substring in {hits / n:.2%}")
    for r in rows[:8]:
        print(r)
