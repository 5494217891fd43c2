"""Chat messages to prompt tokens through the checkpoint's chat template (HF's ``apply_chat_template``), as vLLM's
``LLM.chat`` and OpenAI's chat endpoint render them: the template's text, then its tokens without special tokens added
(the template writes its own)."""

from __future__ import annotations

from typing import Any


def message_content(content: Any, where: str) -> str | None:
    """A message's content as the template takes it: a string, None, or OpenAI's list of parts, of which only
    ``{"type": "text", "text": ...}`` parts are supported (joined)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where}: content must be a string, a list of text parts or None, got "
                         f"{type(content).__name__}")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}: only text parts ({{'type': 'text', 'text': str}}) are supported, got {part!r}")
        texts.append(part["text"])
    return "".join(texts)


def render_chat(tokenizer, messages, *, add_generation_prompt: bool = True,
                chat_template_kwargs: dict | None = None) -> list[int]:
    """The prompt token ids of one conversation: its ``render_chat_text``, encoded without special tokens added."""
    text = render_chat_text(tokenizer, messages, add_generation_prompt=add_generation_prompt,
                            chat_template_kwargs=chat_template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def render_chat_text(tokenizer, messages, *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict | None = None) -> str:
    """The prompt text of one conversation: a list of ``{"role": str, "content": ...}`` messages. Raises
    ValueError for a malformed message, a folder without a tokenizer, or a template that refuses the messages."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat needs the checkpoint's tokenizer and its chat template: this model folder has none")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise ValueError(f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"a conversation must be a non-empty list of messages, got {messages!r}")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} must be a dict with a string 'role', got {message!r}")
        rendered.append({**message, "content": message_content(message.get("content"), f"message {i}")})
    try:
        return tokenizer.apply_chat_template(rendered, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **(chat_template_kwargs or {}))
    except Exception as error:  # a template's own checks (roles, order) raise anything
        raise ValueError(f"the chat template refused the messages: {error}") from None
