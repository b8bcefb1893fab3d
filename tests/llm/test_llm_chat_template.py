"""Chat templates render as `transformers`' `apply_chat_template` does: against its outputs recorded in
tests/fixtures/chat_templates_transformers.json (always), and live when transformers is installed; the plain
fallback matches the SFT chat format."""

import json
import os

import pytest

from llm_checkpoint import CHATML, make_checkpoint
from jaxlab.llm import ChatTemplate, TemplateError
from jaxlab.llm import chat

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}\n"
    "{% for message in loop_messages %}\n"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}\n"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}\n"
    "    {% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}\n"
    "{% endfor %}")

TOOLS_LOOP = (
    "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}\n"
    "  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
    "{{ m['role'] | upper }}> {{ m['content'] }}\n"
    "  {% if loop.index > 3 %}{% break %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT>{% endif %}")

MESSAGES = [{"role": "system", "content": "Be brief & exact: <b>"}, {"role": "user", "content": "  2 + 3 = ?  "},
            {"role": "assistant", "content": "5"}, {"role": "user", "content": "und 4 × 4? ünïcode"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds two numbers, écrit",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


RECORDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "chat_templates_transformers.json")


def test_render_equals_recorded_transformers_output():
  with open(RECORDED, encoding="utf-8") as f:
    cases = json.load(f)["cases"]
  templates = {"chatml": CHATML, "llama2": LLAMA2, "tools_loop": TOOLS_LOOP}
  assert len(cases) == 6
  for case in cases:
    t = templates[case["template"]]
    msgs = MESSAGES[:3] if t is LLAMA2 else MESSAGES
    kw = {"tools": TOOLS} if t is TOOLS_LOOP else {}
    ours = ChatTemplate(t, {"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    assert ours.render(msgs, add_generation_prompt=case["add_generation_prompt"], **kw) == case["text"], case


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
  transformers = pytest.importorskip("transformers", reason="the live reference needs transformers (pip install "
                                     "transformers); its recorded outputs are checked above")
  pytest.importorskip("tokenizers")
  folder = make_checkpoint(str(tmp_path_factory.mktemp("tmpl")), template=None)
  return transformers.AutoTokenizer.from_pretrained(folder), folder


@pytest.mark.parametrize("template", [CHATML, LLAMA2, TOOLS_LOOP], ids=["chatml", "llama2", "tools_loop"])
@pytest.mark.parametrize("gen", [True, False])
def test_render_equals_transformers(hf_tokenizer, template, gen):
  tok, _ = hf_tokenizer
  tok.chat_template = template
  ours = ChatTemplate(template, {"bos_token": tok.bos_token, "eos_token": tok.eos_token})
  msgs = MESSAGES[:3] if template is LLAMA2 else MESSAGES
  kw = {"tools": TOOLS} if template is TOOLS_LOOP else {}
  want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
  assert ours.render(msgs, add_generation_prompt=gen, **kw) == want
  if template is TOOLS_LOOP:
    assert json.dumps(TOOLS, ensure_ascii=False) in want          # tojson does not escape non-ASCII or HTML


def test_raise_exception_in_template(hf_tokenizer):
  tok, _ = hf_tokenizer
  bad = [MESSAGES[1], MESSAGES[1]]
  tok.chat_template = LLAMA2
  with pytest.raises(Exception, match="roles must alternate"):
    tok.apply_chat_template(bad, tokenize=False)
  with pytest.raises(TemplateError, match="refused the messages: roles must alternate"):
    ChatTemplate(LLAMA2, {"bos_token": "<s>", "eos_token": "</s>"}).render(bad)


def test_template_read_from_folder_and_token_ids_equal_transformers(tiny_hf):
  transformers = pytest.importorskip("transformers")
  from jaxlab.llm import LocalBackend
  backend = LocalBackend(tiny_hf)
  ref = transformers.AutoTokenizer.from_pretrained(tiny_hf)
  want = ref.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
  want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
  assert backend.encode(MESSAGES) == list(want)
  assert chat.read_template(tiny_hf) == CHATML


def test_plain_fallback_is_the_sft_chat_format(tmp_path):
  from jaxlab.lm import sft_data
  from jaxlab.lm.tokenizer import ByteTokenizer
  tok = ByteTokenizer()
  t = ChatTemplate(None, chat.special_tokens_of(tok))
  ex = sft_data.ChatFormat().render(MESSAGES[1:3], "test")
  text = t.render(MESSAGES[1:3], add_generation_prompt=True)
  assert text == "<|bos|>" + "".join(s for s, _ in ex.spans) + "assistant: "
  assert chat.read_template(str(tmp_path)) is None


def test_template_errors_are_one_line(tmp_path):
  with pytest.raises(TemplateError, match=r"does not parse \(line 1"):
    ChatTemplate("{% for m in messages %}")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "tool_use",
                                                                                 "template": "x"}]}))
  with pytest.raises(Exception, match="without a 'default' entry"):
    chat.read_template(str(tmp_path))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default",
                                                                                 "template": "T"}]}))
  assert chat.read_template(str(tmp_path)) == "T"
  (tmp_path / "chat_template.jinja").write_text("J")
  assert chat.read_template(str(tmp_path)) == "J"       # transformers' separate file wins
