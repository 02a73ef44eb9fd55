#!/usr/bin/env python3
"""Oracle for tests/cpu/policy/test_chat_template.cpp: transformers' apply_chat_template(tokenize=False).

  chat_template_oracle.py OUT_JSON [--smollm2-gguf PATH]

Renders a set of conversations with three Jinja templates:
  - smollm2: the real template string from the SmolLM2 GGUF (tokenizer.chat_template), when the
    file is given (or CUDA_AGENT_SMOLLM2_GGUF names it);
  - qwen2.5 and qwen3: templates written here to reproduce the output format of the published
    Qwen2.5 and Qwen3 chat templates (system prompt default, "# Tools" section, <tool_call> and
    <tool_response> blocks, Qwen3's think handling and enable_thinking).
Writes a JSON list of cases: name, family, template, messages (what the C++ renderer gets),
tools, add_generation_prompt, enable_thinking (null when not passed), expected. Exits 2 when
transformers is missing.
"""

import argparse
import copy
import json
import os
import sys

try:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
except ImportError as e:
    print(f"transformers/tokenizers are not installed in {sys.executable}: {e} (pip install transformers tokenizers)",
          file=sys.stderr)
    sys.exit(2)

TOOLS_HEAD = ("# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
              "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>")
TOOLS_TAIL = ("\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\\n</tool_call><|im_end|>\\n")

QWEN25 = r"""
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] -}}
  {%- else -%}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -}}{%- endif -%}
  {{- '\n\n' + 'TOOLS_HEAD' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- 'TOOLS_TAIL' -}}
{%- elif messages[0]['role'] == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- else -%}
  {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set prev_role = messages[loop.index0 - 1].role if loop.index0 > 0 else '' -%}
  {%- set next_role = messages[loop.index0 + 1].role if not loop.last else '' -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
        or (message.role == 'assistant' and not message.tool_calls) -%}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.content -%}{{- '\n' + message.content -}}{%- endif -%}
    {%- for call in message.tool_calls -%}
      {%- set f = call.function if call.function is defined else call -%}
      {{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if prev_role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
    {%- if next_role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".replace("TOOLS_HEAD", TOOLS_HEAD).replace("TOOLS_TAIL", TOOLS_TAIL.replace('"', '\\"').replace("'", "\\'"))

QWEN3 = r"""
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
  {{- 'TOOLS_HEAD' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- 'TOOLS_TAIL' -}}
{%- elif messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=messages|length - 1, found=false) -%}
{%- for message in messages|reverse -%}
  {%- if not ns.found and message.role == 'user' and message.content is string
        and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) -%}
    {%- set ns.found = true -%}
    {%- set ns.last_query = messages|length - 1 - loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content -}}
    {%- endif -%}
    {%- for call in message.tool_calls or [] -%}
      {%- if not loop.first or content -%}{{- '\n' -}}{%- endif -%}
      {%- set f = call.function if call.function else call -%}
      {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
      {%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".replace("TOOLS_HEAD", TOOLS_HEAD).replace("TOOLS_TAIL", TOOLS_TAIL.replace('"', '\\"').replace("'", "\\'"))

TOOLS = [
    {"type": "function", "function": {
        "name": "Bash", "description": "Run a shell command in the workspace; returns stdout+stderr.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "the command, e.g. `nvcc -O3 k.cu`"},
            "timeout_s": {"type": "number", "default": 120.0, "minimum": 1e-05},
            "background": {"type": "boolean", "default": False}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "Read", "description": "Lit un fichier (UTF-8) — returns \"numbered\" lines\tand\\n escapes.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "offset": {"type": "integer", "default": 0},
            "limit": {"type": "integer", "default": 2000, "maximum": 1000000},
            "ratio": {"type": "number", "default": 0.5}, "tags": {"type": "array", "items": {"type": "string"}},
            "nothing": {"default": None}},
            "required": ["path"]}}},
]


def call(name, arguments, openai=True):
    if openai:
        return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"name": name, "arguments": arguments}


def conversations():
    """(name, families, messages, tools)"""
    chat_all = ["smollm2", "qwen2.5", "qwen3"]
    qwen = ["qwen2.5", "qwen3"]
    yield "plain", chat_all, [{"role": "user", "content": "Hello! How are you?"}], None
    yield "system_multi_turn", chat_all, [
        {"role": "system", "content": "You write fast CUDA kernels."},
        {"role": "user", "content": "Write a ReLU kernel."},
        {"role": "assistant",
         "content": "```cuda\n__global__ void relu(float* x, int n) {\n  int i = threadIdx.x;\n}\n```"},
        {"role": "user", "content": "Now vectorize it — float4, s'il vous plaît."}], None
    yield "multi_turn_no_system", chat_all, [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c\n"}], None
    yield "tool_message_and_ignored_tools", ["smollm2"], [
        {"role": "user", "content": "ls"}, {"role": "assistant", "content": "<tool_call>ls</tool_call>"},
        {"role": "tool", "content": "model.py\nmodel_new.py"}], TOOLS
    tool_round = [
        {"role": "system", "content": "You are a CUDA agent."},
        {"role": "user", "content": "Profile the kernel."},
        {"role": "assistant", "content": None, "tool_calls": [call("Bash", {"command": "nvcc -O3 k.cu && ./a.out"})]},
        {"role": "tool", "tool_call_id": "call_Bash", "content": "ok: 1.23 ms"},
        {"role": "assistant", "content": "Two reads at once.", "tool_calls": [
            call("Read", '{"path": "model_new.py", "limit": 50}'),
            call("Bash", {"command": "cat log.txt", "timeout_s": 2.5, "nested": {"a": [1, 2.0, None, True]}},
                 openai=False)]},
        {"role": "tool", "content": "   1\timport torch"},
        {"role": "tool", "content": "speedup: 2.1x\n"},
        {"role": "assistant", "content": "Done: 2.1x faster than eager. Ünïcödé ✓"},
        {"role": "user", "content": "thanks"}]
    yield "tools_tool_calls_tool_responses", qwen, tool_round, TOOLS
    yield "tools_without_system", qwen, tool_round[1:4], TOOLS
    yield "tool_responses_end_the_conversation", qwen, tool_round[:7], TOOLS
    yield "thinking_history", ["qwen3"], [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nreason one\n</think>\n\nanswer one"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "answer two", "reasoning_content": "\nreason two\n"}], None
    yield "thinking_after_last_query", ["qwen3"], [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix the kernel."},
        {"role": "assistant", "content": "<think>plan: read first</think>Reading.",
         "tool_calls": [call("Read", {"path": "k.cu"})]},
        {"role": "tool", "content": "__global__ void k() {}"},
        {"role": "assistant", "content": "No think here.", "tool_calls": [call("Bash", {"command": "make"})]},
        {"role": "tool", "content": "built"},
        {"role": "user", "content": "<tool_response>\nextra\n</tool_response>"},
        {"role": "assistant", "content": "<think>\n\nall good\n\n</think>\n\nFinal answer."}], TOOLS


def qwen25_oracle_messages(messages):
    """What the Qwen2.5 template gets: tool-call arguments given as JSON strings parsed (the C++
    renderer parses them; the template itself would quote the string)."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            f = c.get("function", c)
            if isinstance(f.get("arguments"), str):
                f["arguments"] = json.loads(f["arguments"])
    return out


def smollm2_template(path):
    import gguf
    reader = gguf.GGUFReader(path)
    return reader.fields["tokenizer.chat_template"].contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--smollm2-gguf", default=os.environ.get("CUDA_AGENT_SMOLLM2_GGUF", ""))
    args = ap.parse_args()
    templates = {"qwen2.5": QWEN25, "qwen3": QWEN3}
    notes = []
    if args.smollm2_gguf and os.path.isfile(args.smollm2_gguf):
        templates["smollm2"] = smollm2_template(args.smollm2_gguf)
    else:
        notes.append(f"smollm2 skipped: CUDA_AGENT_SMOLLM2_GGUF is unset or missing ({args.smollm2_gguf!r})")
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab={"a": 0}, merges=[])))
    cases = []
    for name, families, messages, tools in conversations():
        for family in families:
            if family not in templates:
                continue
            oracle_messages = qwen25_oracle_messages(messages) if family == "qwen2.5" else messages
            thinking = [None, True, False] if family == "qwen3" else [None]
            for gen in (True, False):
                for enable_thinking in thinking:
                    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
                    text = tok.apply_chat_template(copy.deepcopy(oracle_messages), tools=tools,
                                                   chat_template=templates[family], tokenize=False,
                                                   add_generation_prompt=gen, **kw)
                    cases.append({"name": name, "family": family, "template": templates[family], "messages": messages,
                                  "tools": tools, "add_generation_prompt": gen, "enable_thinking": enable_thinking,
                                  "expected": text})
    with open(args.out_json, "w", encoding="utf-8") as f:
        json.dump({"cases": cases, "notes": notes}, f, ensure_ascii=False)
    print(f"{len(cases)} cases; " + "; ".join(notes))


if __name__ == "__main__":
    main()
