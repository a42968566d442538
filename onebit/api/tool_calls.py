"""Tools in a chat request: what the prompt shows, which grammar forces a call, and how the output
becomes `message.tool_calls` (whole or as stream deltas; one code path for both)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from onebit.api.protocol import ChatCompletionRequest
from onebit.api.state import ServerState
from onebit.models.tool_formats import ParsedCall, ToolFormat, detect_tool_format
from onebit.protocol import InvalidRequest
from onebit.protocol.grammar import GrammarSpec


@dataclass
class ToolPlan:
    """A chat request's tools: those the template renders, the format to parse calls in (None: do not
    parse), whether several calls may come, and the grammar forcing a call (tool_choice required/named)."""

    tools: list[dict] | None = None
    format: ToolFormat | None = None
    parallel: bool = True
    grammar: GrammarSpec | None = None


def _check_tools(tools) -> list[dict]:
    """OpenAI function tools, each with a name; 400 naming `tools` otherwise."""
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise InvalidRequest(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"tools[{i}].function.name must be a non-empty string", "tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        out.append({**tool, "type": "function"})
    return out


def _chosen(choice, tools: list[dict]) -> tuple[str, list[dict]]:
    """("auto" | "none" | "required" | "named", the tools a forced call may use)."""
    if choice is None:
        return ("auto" if tools else "none"), tools
    if choice in ("auto", "none", "required"):
        return choice, tools
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
    if not isinstance(name, str):
        raise InvalidRequest('tool_choice must be "auto", "none", "required" or '
                             '{"type": "function", "function": {"name": ...}}', "tool_choice")
    named = [t for t in tools if t["function"]["name"] == name]
    if not named:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return "named", named


def token_ref(state: ServerState, marker: str) -> str:
    """A marker as a Lark grammar must write it: a special token by id (`<[id]>`), else a string."""
    tok = state.tokenizer
    token = tok.token_to_id(marker)
    if token is not None and token in tok.special_token_ids:
        return f"<[{token}]>"
    return json.dumps(marker)


def plan_tools(state: ServerState, request: ChatCompletionRequest) -> ToolPlan:
    """Check `tools`, `tool_choice` and `parallel_tool_calls` and decide what each does."""
    tools = _check_tools(request.tools or [])
    mode, usable = _chosen(request.tool_choice, tools)
    if mode in ("required", "named") and not tools:
        raise InvalidRequest(f"tool_choice {mode!r} needs tools", "tool_choice")
    if mode == "none" or not tools:
        return ToolPlan()  # the prompt shows no tools; the output is plain content
    fmt = detect_tool_format(state.tokenizer.chat_template)
    parallel = request.parallel_tool_calls is not False
    plan = ToolPlan(tools, fmt, parallel)
    if mode != "auto":
        text = fmt.grammar(usable, parallel, lambda m: token_ref(state, m))
        plan.grammar = GrammarSpec("lark", text, "tool_choice")
    return plan


def new_call_id() -> str:
    """A fresh tool call id, as OpenAI writes them."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallPiece:
    """A piece of tool call `index` for a stream: the first carries its id and name, the others
    only more of its arguments (the pieces' arguments concatenate to the whole)."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass
class ToolCallStream:
    """Splits one choice's content into plain text and tool calls as it arrives. Text before a call's
    marker streams at once; from the marker on it is held. Where the format tells a call's name before
    the call ends (Hermes), the call opens then and its arguments follow in pieces as they are
    generated; otherwise each call is released whole when complete (at the end for formats whose
    calls only end with the message). Output that does not parse as calls is released as text at the end."""

    format: ToolFormat
    parallel: bool = True
    calls: list[tuple[str, ParsedCall]] = field(default_factory=list)  # (id, call) complete so far
    _pending: str = ""
    _held: str | None = None  # from the marker on
    _sent_text: bool = False
    _open: list = field(default_factory=list)  # [id, arguments sent] of the call being streamed

    def _limit(self) -> int:
        return 1_000_000 if self.parallel else 1

    def _close_calls(self, parsed: list[ParsedCall]) -> list[CallPiece]:
        """Pieces finishing the calls newly complete in `parsed` (the open one's remaining arguments)."""
        pieces = []
        for call in parsed[len(self.calls):self._limit()]:
            index = len(self.calls)
            if self._open:
                call_id, sent = self._open
                self._open = []
                rest = call.arguments[len(sent):] if call.arguments.startswith(sent) else ""
                if rest:
                    pieces.append(CallPiece(index, None, None, rest))
            else:
                call_id = new_call_id()
                pieces += [CallPiece(index, call_id, call.name, ""), CallPiece(index, None, None, call.arguments)]
            self.calls.append((call_id, call))
        return pieces

    def _stream_open_call(self) -> list[CallPiece]:
        """Pieces of the call being generated: its opening, then arguments as they become certain."""
        found = self.format.open_call(self._held)
        if found is None or len(self.calls) >= self._limit():
            return []
        name, args = found
        pieces = []
        if not self._open:
            self._open = [new_call_id(), ""]
            pieces.append(CallPiece(len(self.calls), self._open[0], name, ""))
        sent = self._open[1]
        if len(args) > len(sent) and args.startswith(sent):
            pieces.append(CallPiece(len(self.calls), None, None, args[len(sent):]))
            self._open[1] = args
        return pieces

    def feed(self, text: str, final: bool) -> tuple[str, list[CallPiece]]:
        """(plain text to send, tool call pieces to send)."""
        content = ""
        if self._held is None:
            text = self._pending + text
            self._pending = ""
            at, keep = self.format.find_start(text, not self._sent_text)
            if at < 0:
                if final:
                    keep = 0
                content, self._pending = text[:len(text) - keep], text[len(text) - keep:]
                self._sent_text = self._sent_text or bool(content.strip())
                return content, []
            content, self._held = text[:at], text[at:]
        else:
            self._held += text
        pieces = []
        if final or self.format.complete(self._held):
            _, parsed = self.format.parse(self._held)
            pieces += self._close_calls(parsed)
            if final and not parsed and not self.calls and not self._open:
                content += self._held
        if not final:
            pieces += self._stream_open_call()
        return content, pieces
