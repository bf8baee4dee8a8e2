"""Commands Cairn receives: ``invoke``, ``resume``, ``delete``, ``history`` and ``fork``
(commands topic), ``cancel`` (control topic).

Field names are fixed by the design; a command without ``schema_version`` is read as version 1. An
``invoke`` whose prompt has a resume shape is a resume: :meth:`InvokeCommand.as_resume`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator

from service.wire.base import (
    WIRE_SCHEMA_VERSION,
    Id,
    InboundModel,
    JsonObject,
    PartModel,
    WireVersion,
)
from service.wire.blocks import MESSAGE_KEYS, ContentBlock, PromptMessage
from service.wire.pauses import (
    ANSWERS_TAG,
    CHECKPOINT_TAG,
    CheckpointResume,
    InterruptAnswer,
    InterruptAnswers,
    ResumeInput,
    is_answers_shape,
    is_checkpoint_shape,
    is_wrapped_checkpoint,
)

CANCEL_MESSAGE_MAX_LENGTH = 10_000
"""The longest cancel ``message`` (characters). It becomes the closing assistant message of the
command it stops, so it travels in that command's result: left unbounded, a message close to the
record limit would turn the cancelled command's result into ``limit_exceeded`` and lose the turn
it ran. At most 60 KB as JSON (six bytes a character escaped), it always leaves room for the rest
of the result."""

TEXT_TAG = "<text>"
BLOCKS_TAG = "<blocks>"
MESSAGES_TAG = "<messages>"


class Limits(PartModel):
    """Bounds of the turn (counted across all its invocations); each is optional."""

    max_cycles: Annotated[int, Field(ge=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    deadline_s: Annotated[float, Field(gt=0)] | None = None


def _is_message(item: Any) -> bool:
    return isinstance(item, PromptMessage) or any(key in item for key in MESSAGE_KEYS)


def _prompt_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return TEXT_TAG
    if isinstance(value, CheckpointResume) or is_checkpoint_shape(value):
        return CHECKPOINT_TAG
    if not isinstance(value, list) or is_wrapped_checkpoint(value):
        return None
    if is_answers_shape(value):
        return ANSWERS_TAG
    if any(isinstance(item, PromptMessage | dict) and _is_message(item) for item in value):
        return MESSAGES_TAG
    return BLOCKS_TAG


Prompt = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag(TEXT_TAG)]
    | Annotated[Annotated[list[ContentBlock], Field(min_length=1)], Tag(BLOCKS_TAG)]
    | Annotated[Annotated[list[PromptMessage], Field(min_length=1)], Tag(MESSAGES_TAG)]
    | Annotated[CheckpointResume, Tag(CHECKPOINT_TAG)]
    | Annotated[InterruptAnswers, Tag(ANSWERS_TAG)],
    Discriminator(
        _prompt_tag,
        custom_error_type="prompt_shape",
        custom_error_message=(
            "must be text, a list of content blocks, a list of messages, or a resume payload"
        ),
    ),
]


class _Command(InboundModel):
    type: str
    schema_version: WireVersion = WIRE_SCHEMA_VERSION
    command_id: Id
    """Unique per command; the idempotency key (a repeated id is answered once)."""
    session_id: Id
    """Also the record key: every command of a session lands on the same partition."""


Checkpointing = Annotated[
    bool | None,
    Field(description="Pause at checkpoints in this turn; absent means the agent's default."),
]
InvocationState = Annotated[
    JsonObject | None, Field(description="A JSON object handed to tools and hooks.")
]
TurnLimits = Annotated[
    Limits | None, Field(description="Bounds of the turn; absent means the agent's limits.")
]
ResumeCheckpointing = Annotated[
    bool | None,
    Field(
        description="Pause at checkpoints for the rest of this turn; absent means as the turn "
        "does (its invoke's setting, else the agent's default)."
    ),
]
ResumeLimits = Annotated[
    Limits | None,
    Field(description="Bounds for the rest of this turn; absent means the turn's bounds."),
]


class ResumeCommand(_Command):
    """Continue a paused session: from its checkpoint, or with answers to its interrupts."""

    type: Literal["resume"] = "resume"
    resume: ResumeInput
    agent: Id | None = None
    """Optional; when given it must name the session's agent."""
    checkpointing: ResumeCheckpointing = None
    limits: ResumeLimits = None
    invocation_state: InvocationState = None
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object, echoed unchanged in the result."""

    def engine_input(self) -> Any:
        """The payload as the engine takes it (plain dicts and lists)."""
        if isinstance(self.resume, CheckpointResume):
            return self.resume.model_dump()
        return [answer.model_dump() for answer in self.resume]


class InvokeCommand(_Command):
    """Run an agent on a prompt (a new turn, or abandoning a pause with new input)."""

    type: Literal["invoke"] = "invoke"
    agent: Id
    """Name of an agent hosted by this deployment."""
    prompt: Prompt
    checkpointing: Checkpointing = None
    limits: TurnLimits = None
    invocation_state: InvocationState = None
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object, echoed unchanged in the result."""

    @property
    def is_resume(self) -> bool:
        return isinstance(self.prompt, CheckpointResume) or (
            isinstance(self.prompt, list)
            and bool(self.prompt)
            and all(isinstance(item, InterruptAnswer) for item in self.prompt)
        )

    def as_resume(self) -> ResumeCommand:
        """The resume this invoke stands for (its prompt is a resume payload)."""
        if not self.is_resume:
            raise ValueError("this invoke's prompt is not a resume payload")
        fields = {
            name: getattr(self, name)
            for name in self.model_fields_set
            if name not in ("type", "prompt")
        }
        prompt = self.prompt
        resume: CheckpointResume | list[InterruptAnswer] = (
            prompt
            if isinstance(prompt, CheckpointResume)
            else [item for item in prompt if isinstance(item, InterruptAnswer)]
        )
        return ResumeCommand(resume=resume, **fields)

    def engine_input(self) -> Any:
        """The prompt as the engine takes it (a string or plain dicts)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if isinstance(self.prompt, CheckpointResume):
            return self.prompt.model_dump()
        return [
            item
            if isinstance(item, dict)
            else item.engine_message()
            if isinstance(item, PromptMessage)
            else item.model_dump()
            for item in self.prompt
        ]


class CancelCommand(_Command):
    """Stop a running invocation, resolve a pause, or skip a queued command (control topic)."""

    type: Literal["cancel"] = "cancel"
    target_command_id: Id | None = None
    """Cancel exactly this command; absent means whatever the session is doing."""
    message: Annotated[str, Field(max_length=CANCEL_MESSAGE_MAX_LENGTH)] | None = None
    """Text of the assistant message a cancelled model stream leaves behind (at most
    ``CANCEL_MESSAGE_MAX_LENGTH`` characters)."""
    after_current_tools: bool = False
    """Let the running tool batch finish, then stop."""

    @field_validator("target_command_id")
    @classmethod
    def _not_itself(cls, target: str | None, info: ValidationInfo) -> str | None:
        # Answered as its own target it would get two results under one command id.
        if target is not None and target == info.data.get("command_id"):
            raise ValueError("a cancel cannot target itself (its own command_id)")
        return target


class DeleteCommand(_Command):
    """Delete a session: stop what runs or waits for it and tombstone all of its state."""

    type: Literal["delete"] = "delete"
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object, echoed unchanged in the result."""


class HistoryCommand(_Command):
    """List the session's versions, newest first, one page per command (Cairn extension)."""

    type: Literal["history"] = "history"
    limit: Annotated[int, Field(ge=1, le=100)] = 20
    """Most entries to list."""
    before: Annotated[int, Field(ge=1)] | None = None
    """List only versions older than this one (the ``next_before`` of the previous page);
    absent means from the newest."""
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object, echoed unchanged in the result."""


class ForkCommand(_Command):
    """Create the session ``session_id`` from version ``version`` of ``source_session_id``
    (Cairn extension). Addressed to the new session: keyed by its id, like every command."""

    type: Literal["fork"] = "fork"
    source_session_id: Id
    """The session forked from; it is left unchanged."""
    version: Annotated[int, Field(ge=1)]
    """Its version the new session starts from."""
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object, echoed unchanged in the result."""


Command = InvokeCommand | ResumeCommand | DeleteCommand | HistoryCommand | ForkCommand
"""What the commands topic carries, after an ``invoke`` with a resume prompt became a resume."""
