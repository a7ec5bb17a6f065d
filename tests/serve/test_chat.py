# `lineage chat` with piped input: the state kept between turns gives the replies a fresh sequence
# over the whole history gives; /save and /load continue a conversation in another process bit for
# bit; /stats and the per-turn line report what was reused.
import re

import pytest

from conftest import run_lineage

TURNS = ["Hello there", "How are you?", "Tell me more."]


def chat(model_dir, lines, *args):
    p = run_lineage("chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "10", "--threads", "1",
                    *args, stdin="".join(line + "\n" for line in lines))
    return p.stdout.split("\n")[:-1], p.stderr


def reused(stderr):
    return [(int(a), int(b)) for a, b in re.findall(r"prompt (\d+) tokens, (\d+) of them already in the state", stderr)]


def render_plain(messages):
    return "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant:"


def test_plain_chat_matches_fresh_prefill(gpt2_dir):
    replies, err = chat(gpt2_dir, TURNS[:2])
    assert len(replies) == 2, err
    # Turn 2 fed only what turn 1 did not leave in the state...
    (p1, r1), (p2, r2) = reused(err)
    assert r1 == 0 and r2 > 0 and r2 < p2
    # ...and its reply equals a fresh sequence over the whole rendered history.
    history = [{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": replies[0].strip()},
               {"role": "user", "content": TURNS[1]}]
    fresh = run_lineage("generate", "--model", str(gpt2_dir), "--prompt", render_plain(history), "--temperature", "0",
                        "--max-tokens", "10").stdout[:-1]
    assert replies[1] == fresh.split("\n\n")[0]


@pytest.mark.parametrize("which", ["gpt2", "hybrid"])
def test_save_load_continues_bit_for_bit(which, request, tmp_path):
    model_dir = request.getfixturevalue(f"{which}_dir")
    state = tmp_path / "conv.state"
    whole, _ = chat(model_dir, TURNS)
    first, err = chat(model_dir, TURNS[:2] + [f"/save {state}", "/stats"])
    assert first == whole[:2]
    assert "[saved 4 messages" in err and "state:" in err and "tok/s" in err
    rest, err = chat(model_dir, [f"/load {state}", TURNS[2]])
    assert rest == whole[2:], f"{which}: the loaded conversation continues differently"
    assert "[loaded 4 messages" in err
    assert reused(err)[0][1] > 0, "the loaded state is reused, not re-prefilled"


def test_hybrid_keeps_its_state_and_the_cache_resumes(hybrid_dir):
    # A Kimi-style template over the hybrid (KDA + MLA). Turn 2 feeds only the new text after the
    # state's own tokens (turn 1's prompt and reply)...
    replies, err = chat(hybrid_dir, TURNS[:2] + ["/stats", "/reset", TURNS[0]], "--checkpoint-every", "8")
    (p1, r1), (p2, r2), (p3, r3) = reused(err)
    assert r1 == 0 and r2 == p1 + 10 and r2 < p2
    assert "prefix cache:" in err
    m = re.search(r"state: (\d+) tokens, ([\d.]+) (B|KiB|MiB)", err)
    assert m and int(m.group(1)) > p2
    # ...and after /reset the same first message resumes from the cache: the recurrent layers from
    # their last checkpoint (every 8 tokens) before the prompt's last token, with the same reply.
    assert p3 == p1 and r3 == ((p1 - 1) // 8) * 8 and r3 > 0
    assert replies[2] == replies[0]


def test_reset_and_bad_commands(gpt2_dir, tmp_path):
    replies, err = chat(gpt2_dir, [TURNS[0], "/reset", TURNS[0]])
    assert replies[0] == replies[1], "a new conversation after /reset starts as the first did"
    p = run_lineage("chat", "--model", str(gpt2_dir), stdin="/load /nonexistent.state\n", check=False)
    assert p.returncode != 0 and "/nonexistent.state" in p.stderr
    p = run_lineage("chat", "--model", str(gpt2_dir), stdin="/frobnicate\n", check=False)
    assert p.returncode != 0 and "unknown command /frobnicate" in p.stderr
    bad = tmp_path / "bad.state"
    bad.write_bytes(b"LINSTATE" + b"\0" * 40)
    p = run_lineage("chat", "--model", str(gpt2_dir), stdin=f"/load {bad}\n", check=False)
    assert p.returncode != 0 and str(bad) in p.stderr


def test_full_context_is_an_error_naming_it(gpt2_dir):
    # The tiny GPT-2 holds 64 positions: a few turns fill it, and the next one is refused.
    p = run_lineage("chat", "--model", str(gpt2_dir), "--temperature", "0", "--max-tokens", "10",
                    stdin="".join(f"{t}\n" for t in TURNS * 3), check=False)
    assert p.returncode == 2 and "the model's context holds 64" in p.stderr, p.stderr
    assert "/reset starts a new one" in p.stderr
