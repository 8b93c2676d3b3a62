"""Group invariants and cross-group rules raise ConfigError naming the full key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from skyrl.config import ConfigError, register_configs
from skyrl.config.root import ServeConfig
from skyrl.config.validate import check_critic_only_steps, validate


def _validate(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["trainer.train_batch_size=-4"], "trainer.train_batch_size", "must be >= 1, got -4"),
        (["trainer.policy_optimizer.lr=0"], "trainer.policy_optimizer.lr", "must be > 0"),
        (["trainer.zero_stage=4"], "trainer.zero_stage", "must be 0, 1, 2 or 3"),
        (
            ["trainer.offload_optimizer=true"],
            "trainer.offload_optimizer",
            "needs trainer.zero_stage >= 1",
        ),
        (["generator.sampling.top_p=0"], "generator.sampling.top_p", "(0, 1]"),
        # vLLM raises 0 < T < 0.01 to 0.01 (with a warning): it would sample at 0.01 while the
        # trainer's logprobs divide by 0.005, so old and new policy logprobs disagree
        (
            ["generator.sampling.temperature=0.005"],
            "generator.sampling.temperature",
            "must be 0 (greedy) or >= 0.01, got 0.005",
        ),
        # vLLM refuses T > 2 on every request (as OpenAI's API does); the hf engine took it
        (
            ["generator.sampling.temperature=2.5"],
            "generator.sampling.temperature",
            "must be <= 2, got 2.5 (vLLM refuses a higher one, as OpenAI's API does)",
        ),
        (["generator.sampling.temperature=inf"], "generator.sampling.temperature", "got inf"),
        (
            ["generator.eval_sampling.temperature=1e-9"],
            "generator.eval_sampling.temperature",
            ">= 0.01",
        ),
        # "" is in every text: it would end each completion at its first token
        (
            ["generator.sampling.stop=['</answer>','']"],
            "generator.sampling.stop[1]",
            "is an empty string",
        ),
        (["generator.eval_sampling.stop=['']"], "generator.eval_sampling.stop[0]", "empty"),
        (
            ["generator.kv_cache_memory_bytes=1000"],
            "generator.kv_cache_memory_bytes",
            "must be >= 1 MiB or null, got 1000",
        ),
        (["trainer.train_batch_size=10"], "trainer.policy_mini_batch_size", "divisible"),
        (["trainer.micro_batch_max_tokens=0"], "trainer.micro_batch_max_tokens", "must be >= 1"),
        (
            ["algorithm.use_kl_loss=true", "algorithm.use_kl_in_reward=true"],
            "algorithm.use_kl_loss",
            "mutually exclusive",
        ),
        (
            ["algorithm.advantage_estimator=gae", "generator.step_wise=true"],
            "algorithm.advantage_estimator",
            "step_wise",
        ),
        (["algorithm.policy_loss=nope"], "algorithm.policy_loss", "registered: "),
        (
            ["trainer.loggers=[console,nope]"],
            "trainer.loggers",
            "unknown logger 'nope'; registered: console, jsonl, ",
        ),
        (["generator.backend=nope"], "generator.backend", "engine backend 'nope'; registered: "),
        (["imports=[no_such_module_xyz]"], "imports[0]", "cannot import"),
        (
            ["trainer.weight_sync=nccl"],
            "trainer.weight_sync",
            "auto, shared_memory, object_store, broadcast",
        ),
        (["generator.num_gpus_per_engine=-1"], "generator.num_gpus_per_engine", ">= 0"),
        # NCCL needs both ends on GPUs, engines on GPUs of their own
        (
            ["trainer.weight_sync=broadcast", "trainer.num_gpus_per_worker=1"],
            "trainer.weight_sync",
            "generator.num_gpus_per_engine=0.0",
        ),
        (
            ["generator=vllm", "generator.tensor_parallel_size=2"],
            "trainer.weight_sync",
            "the shared_memory sync does not reach",
        ),
        (["model.lora.rank=-1"], "model.lora.rank", "must be 0 (off) to 512"),
        (["model.lora.rank=600"], "model.lora.rank", "the largest rank vLLM serves"),
        (["model.lora.rank=8", "model.lora.dropout=1"], "model.lora.dropout", "[0, 1)"),
        (
            ["model.lora.rank=8", "model.lora.target_modules=[]"],
            "model.lora.target_modules",
            "names no module",
        ),
        (
            ["model.lora.target_modules=[q_proj,all-linear]"],
            "model.lora.target_modules[1]",
            "all-linear must be the only entry",
        ),
        (["trainer.lora_sync=full"], "trainer.lora_sync", "adapter, merged"),
        (["generator=vllm", "generator.block_size=24"], "generator.block_size", "multiple of 16"),
        (
            [
                "model.lora.rank=8",
                "trainer.max_staleness=1",
                "trainer.partial_rollouts=true",
                "generator.num_cpus_per_engine=1",
            ],
            "trainer.partial_rollouts",
            "keeps the LoRA adapter it started with",
        ),
        # settings under which nothing trains, or the data named is never read
        (
            ["data.train_files=[my/train.jsonl]"],
            "data.train_files",
            "only read with data.source=files (source is 'arithmetic')",
        ),
        (["data.eval_files=[my/eval.jsonl]"], "data.eval_files", "only read with data.source"),
        (
            ["trainer.critic_model_path=some/critic"],
            "trainer.critic_model_path",
            "is only read with a critic (algorithm.advantage_estimator=gae)",
        ),
        (
            ["trainer.critic_only_steps=3"],
            "trainer.critic_only_steps",
            "only with a critic (algorithm.advantage_estimator=gae); with 'grpo' the policy "
            "would not train for the first 3 steps",
        ),
        (
            ["algorithm=ppo", "trainer.total_steps=5", "trainer.critic_only_steps=5"],
            "trainer.critic_only_steps",
            "the policy would never train: 5 critic-only steps of 5",
        ),
        (
            ["generator.n_samples_per_prompt=1"],
            "generator.n_samples_per_prompt",
            "'grpo' compares the samples of a prompt: with 1 sample every advantage is 0",
        ),
        (
            ["generator.sampling.temperature=0"],
            "generator.sampling.temperature",
            "'grpo' compares the samples of a prompt: greedy sampling (temperature 0) gives "
            "every sample the same reply",
        ),
        (
            ["generator.sampling.top_k=1"],
            "generator.sampling.top_k",
            "greedy sampling (top_k 1) gives every sample the same reply",
        ),
        # one sample per prompt: every group's rewards are "all equal", so each step ran its
        # max_sample_batches rounds and trained on top-up groups
        (
            [
                "algorithm.advantage_estimator=reinforce_pp",
                "algorithm.dynamic_sampling=filter",
                "generator.n_samples_per_prompt=1",
            ],
            "algorithm.dynamic_sampling",
            "the 'reward_variance' filter keeps groups whose samples' rewards differ: with "
            "generator.n_samples_per_prompt=1 no group can, so every round is dropped",
        ),
        # the eval's default sampling is greedy: 4 samples were 4 copies, pass@4 = pass@1
        (
            ["generator.eval_n_samples_per_prompt=4", "generator.eval_sampling.temperature=0"],
            "generator.eval_n_samples_per_prompt",
            "4 samples per eval prompt with greedy eval sampling (temperature 0) are 4 copies of "
            "one reply: pass@4 would equal pass@1 at 4x the cost; set "
            "generator.eval_sampling.temperature > 0 (top_k -1 or >= 2), or 1 sample",
        ),
        (
            ["generator.eval_n_samples_per_prompt=2", "generator.eval_sampling.top_k=1"],
            "generator.eval_n_samples_per_prompt",
            "greedy eval sampling (top_k 1)",
        ),
        (
            ["algorithm.overlong_buffer_len=64"],
            "algorithm.overlong_buffer_len",
            "must be < generator.max_generate_length (64)",
        ),
        (["algorithm.overlong_penalty_factor=-5"], "algorithm.overlong_penalty_factor", ">= 0"),
        # the tools env runs its calls within one env step's limit
        (
            ["environment=tools", "environment.timeout_s=5"],
            "environment.tool_timeout_s",
            "must be < environment.timeout_s (5), which limits a whole env step (all its "
            "tool calls); got 5",
        ),
        (
            ["environment.max_concurrent_calls=0"],
            "environment.max_concurrent_calls",
            "must be >= 1, got 0",
        ),
        (["environment.max_hung_calls=-1"], "environment.max_hung_calls", "must be >= 0, got -1"),
        # numpy's seed takes 0 <= seed < 2**32 (4294967296); a worker seeds it at start
        (["trainer.seed=-1"], "trainer.seed", "must be in [0, 2**32), got -1"),
        (["trainer.seed=4294967296"], "trainer.seed", "must be in [0, 2**32), got 4294967296"),
        # the dual clip bounds PPO's clipped surrogate; CISPO has none and would ignore it
        (
            ["algorithm=cispo", "algorithm.clip_ratio_c=3.0"],
            "algorithm.clip_ratio_c",
            "is ignored by algorithm.policy_loss='cispo'",
        ),
        # the adaptive controller steers the KL-in-reward coefficient only, by multiplying it
        (["algorithm.kl_ctrl=adaptive"], "algorithm.kl_ctrl", "steers the KL-in-reward"),
        (
            ["algorithm=ppo", "algorithm.kl_ctrl=adaptive", "algorithm.init_kl_coef=0"],
            "algorithm.init_kl_coef",
            "is 0, which the adaptive controller's updates (multiplications) never move",
        ),
        # the root config's step: 8 prompts x 4 samples = 32; 0.2 x 32 = 6.4, so a horizon of
        # 6 lets 1 - 0.2 x 32 / 6 = -0.067 flip the coefficient's sign; 7 is the shortest safe
        (
            ["algorithm=ppo", "algorithm.kl_ctrl=adaptive", "algorithm.kl_horizon=6"],
            "algorithm.kl_horizon",
            "is 6 samples, but each step updates the KL coefficient over 32 (8 prompts x 4 "
            "samples): the factor 1 + e * 32 / 6, e in [-0.2, 0.2], can reach 0 or flip its "
            "sign; set it to at least 7",
        ),
    ],
)
def test_bad_values_name_the_key(overrides, key, fragment):
    with pytest.raises(ConfigError) as info:
        _validate(*overrides)
    assert info.value.key == key
    assert fragment in info.value.message


def test_the_shortest_safe_kl_horizon_is_accepted():
    cfg = _validate("algorithm=ppo", "algorithm.kl_ctrl=adaptive", "algorithm.kl_horizon=7")
    assert cfg.algorithm.kl_horizon == 7


def test_tool_timeout_s_binds_only_the_tools_env():
    # environment.tool_timeout_s (default 5) is read by the tools env only
    assert _validate("environment.timeout_s=3").environment.timeout_s == 3


@pytest.mark.parametrize("step_wise", ["true", "false"])
def test_dp_size_need_not_divide_a_mini_batch(step_wise):
    # 4 prompts x 3 samples = 12 sequences per mini-batch; 5 ranks do not divide it: dispatch
    # pads each mini-batch with zero-loss rows
    typed = _validate(
        "generator.n_samples_per_prompt=3", "trainer.dp_size=5", f"generator.step_wise={step_wise}"
    )
    assert typed.trainer.dp_size == 5


def test_micro_batch_budget_may_exceed_one_sequence():
    # the default job's longest sequence: max_prompt_length 128 + max_generate_length 64 = 192
    # tokens; a budget packs several (memory bounds it, the context each sequence: preflight)
    assert _validate("trainer.micro_batch_max_tokens=1024").trainer.micro_batch_max_tokens == 1024


def test_weight_sync_auto_is_shared_memory_on_cpus_and_broadcast_between_gpus():
    from skyrl.config.validate import weight_sync_path as path

    assert path(_validate()) == "shared_memory"  # CPU default
    assert path(_validate("trainer.weight_sync=broadcast")) == "broadcast"  # gloo between CPUs
    assert path(_validate("trainer.weight_sync=object_store")) == "object_store"
    gpus = ("trainer.num_gpus_per_worker=1", "generator.num_gpus_per_engine=1")
    assert path(_validate(*gpus)) == "broadcast"  # auto on GPUs: NCCL
    assert path(_validate(*gpus, "trainer.weight_sync=object_store")) == "object_store"
    tp2 = ("generator=vllm", "generator.tensor_parallel_size=2")
    assert path(_validate(*tp2, *gpus)) == "broadcast"  # tensor parallel: only broadcast


def test_precision_auto_is_bf16_on_gpus_and_amx_cpus_else_fp32():
    import torch

    from skyrl.config.validate import resolve_precision

    auto = _validate("trainer.precision=auto")
    # validate decided it for this machine's CPU
    this_cpu = "bf16" if torch.cpu.get_capabilities().get("amx_bf16") else "fp32"
    assert auto.trainer.precision == this_cpu
    unresolved = _validate()
    unresolved.trainer.precision = "auto"
    assert resolve_precision(unresolved, cpu_has_amx_bf16=True) == "bf16"
    assert resolve_precision(unresolved, cpu_has_amx_bf16=False) == "fp32"
    unresolved.trainer.num_gpus_per_worker = 1
    assert resolve_precision(unresolved, cpu_has_amx_bf16=False) == "bf16"  # GPUs: bf16
    for chosen in ("fp32", "bf16"):  # an explicit choice is kept whatever the CPU
        assert _validate(f"trainer.precision={chosen}").trainer.precision == chosen


@pytest.fixture
def plain_engine(monkeypatch) -> str:
    """The name of a registered engine backend whose class takes only the model and tokenizer
    paths (no ``lora``, no ``trust_remote_code``); unregistered after the test."""
    from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec

    class PlainEngine:
        def __init__(self, model_path: str, tokenizer_path: str | None = None):
            pass

    name = "plain_engine_for_test"
    entries = {**ENGINE_BACKENDS._entries, name: lambda cfg, p, t: EngineSpec(PlainEngine, {})}
    monkeypatch.setattr(ENGINE_BACKENDS, "_entries", entries)
    return name


def test_lora_adapter_sync_needs_an_engine_that_serves_adapters(plain_engine):
    name = plain_engine
    with pytest.raises(ConfigError) as info:
        _validate(f"generator.backend={name}", "model.lora.rank=8")
    assert info.value.key == "trainer.lora_sync"
    assert "(PlainEngine) takes no lora argument" in info.value.message
    # merged sync sends full weights: any engine will do
    _validate(f"generator.backend={name}", "model.lora.rank=8", "trainer.lora_sync=merged")
    _validate("model.lora.rank=8")  # the built-in engines serve adapters


def test_dual_clip_is_kept_where_a_loss_may_read_it(monkeypatch):
    """ppo and gspo read ``clip_ratio_c``; a recipe's own loss may too, even one registered
    over the name ``cispo``: only the built-in cispo is known to ignore it."""
    from skyrl.algorithms import POLICY_LOSSES

    for loss in ("ppo", "gspo"):
        typed = _validate(f"algorithm.policy_loss={loss}", "algorithm.clip_ratio_c=3.0")
        assert typed.algorithm.clip_ratio_c == 3.0
    assert _validate("algorithm=cispo").algorithm.clip_ratio_c is None

    def my_cispo(*args, **kwargs):  # a recipe's loss under the built-in's name
        raise NotImplementedError

    monkeypatch.setattr(POLICY_LOSSES, "_entries", {**POLICY_LOSSES._entries, "cispo": my_cispo})
    typed = _validate("algorithm=cispo", "algorithm.clip_ratio_c=3.0")
    assert typed.algorithm.clip_ratio_c == 3.0


@pytest.mark.parametrize(
    ("key", "registry", "takes"),
    [
        ("policy_loss", "POLICY_LOSSES", 7),
        ("advantage_estimator", "ADVANTAGE_ESTIMATORS", 2),
        ("loss_reduction", "LOSS_REDUCTIONS", 3),
        ("kl_estimator", "KL_ESTIMATORS", 2),
    ],
)
def test_a_registered_part_that_cannot_take_its_call_is_refused(key, registry, takes, monkeypatch):
    """A recipe's loss of 4 arguments passed validation and failed inside the first training
    step as a worker traceback; it is refused naming its key, with the call it must take.
    Extra arguments with defaults, or *args, are fine."""
    from skyrl import algorithms

    table = getattr(algorithms, registry)
    # registered for this test only (test_registry lists the built-in reductions exactly)
    monkeypatch.setattr(table, "_entries", dict(table._entries))

    def four(a, b, c, d):
        raise AssertionError("never called")

    def with_defaults(*args, extra=None):
        raise AssertionError("never called")

    table.register(f"test_four_{key}", override=True)(four)
    table.register(f"test_star_{key}", override=True)(with_defaults)
    if takes != 4:
        with pytest.raises(ConfigError) as err:
            _validate(f"algorithm.{key}=test_four_{key}")
        assert err.value.key == f"algorithm.{key}"
        assert f"is called with {takes} arguments" in err.value.message
        assert err.value.message.endswith("but it takes (a, b, c, d)")
    _validate(f"algorithm.{key}=test_star_{key}")


def test_trust_remote_code_needs_an_engine_that_takes_it(plain_engine):
    """``model.trust_remote_code=true`` is passed to the engine class (``make_engine``); a
    recipe's engine without that argument failed with a TypeError when the run built it."""
    name = plain_engine
    with pytest.raises(ConfigError) as info:
        _validate(f"generator.backend={name}", "model.trust_remote_code=true")
    assert info.value.key == "model.trust_remote_code"
    assert "(PlainEngine) takes no trust_remote_code argument" in info.value.message
    _validate(f"generator.backend={name}")  # off: any engine will do
    _validate("model.trust_remote_code=true")  # the built-in engines take it


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_seed_range_ends_are_valid(seed):
    assert _validate(f"trainer.seed={seed}").trainer.seed == seed


def test_critic_only_steps_are_checked_against_a_total_known_only_once_the_prompts_load():
    # a prompt file's length sets the steps: validate cannot count them, so it passes here
    cfg = _validate(
        "algorithm=ppo", "data.source=files", "data.train_files=[train.jsonl]",
        "trainer.total_steps=null", "trainer.critic_only_steps=4",
    )  # fmt: skip
    check_critic_only_steps(cfg, 5)  # 4 critic-only steps of 5: the policy trains step 5
    with pytest.raises(ConfigError) as info:
        check_critic_only_steps(cfg, 4)
    assert info.value.key == "trainer.critic_only_steps"
    assert info.value.message == "the policy would never train: 4 critic-only steps of 4"


# ``ServeConfig``'s own value rules (skyrl-serve's ``serve`` node): refused where the config
# is validated, naming the full key, before anything binds or loads


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        # 70000 used to wrap to 70000 - 65536 = 4464 in the bind
        (["serve.port=70000"], "serve.port", "must be 0..65535 (0: any free port), got 70000"),
        (["serve.port=-1"], "serve.port", "must be 0..65535 (0: any free port), got -1"),
        (["serve.host="], "serve.host", "empty (0.0.0.0 listens on every interface)"),
        # before: "" (and "  ") silently served the model as model.path
        (
            ["serve.model_name="],
            "serve.model_name",
            "is empty; leave it unset (null) to serve the model as model.path",
        ),
        (
            ["serve.model_name='  '"],
            "serve.model_name",
            "is empty; leave it unset (null) to serve the model as model.path",
        ),
    ],
)
def test_bad_serve_values_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError) as info:
        _validate(*overrides)
    assert (info.value.key, info.value.message) == (key, message)


@pytest.mark.parametrize("port", [0, 1, 65535])
def test_the_port_range_ends_are_valid(port):
    assert ServeConfig(port=port).port == port


def test_an_unset_model_name_is_valid():
    assert _validate("serve.model_name=null").serve.model_name is None
    assert _validate("serve.model_name=smol").serve.model_name == "smol"
