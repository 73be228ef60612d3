"""The init catalogue: every scheme as its upstream code runs it.

Each scheme names the code it follows in ``upstream`` (repository @ commit, file,
symbol): the snapshot that was read before its rules were written, and against which
``shared/upstream/init-stds-L12-d768.csv`` (and ``tests/data/gemma-init-stds-*.csv``,
measured from Hugging Face's Gemma 2 / 3 on the CPU) were measured; the conformance
tests (tests/test_conformance.py) reproduce every row. Where a codebase departs from
its own paper, the paper's scheme and the code's are separate entries (``deepnet`` and
``deepnet-torchscale``). Where a choice is tinit's own, the description says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .formula import Formula, FormulaError
from .schemes import ParamRules, Rule, Scheme, param_rules, rule, scheme

HF = "huggingface/transformers@v5.24.0"
TORCHSCALE = "microsoft/torchscale@4d1e0e8"
OLMO_CORE = "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/transformer/init.py"
MEGATRON = "NVIDIA/Megatron-LM@d98e8a64dd"
NANOCHAT = "karpathy/nanochat@92d63d4 nanochat/gpt.py"
MUP = "microsoft/mup@1981497"

_SMALL = "sqrt(2 / (5 * d))"
_XAVIER = "sqrt(2 / (fan_in + fan_out))"
#: torch's nn.Linear default (kaiming_uniform_ with a = sqrt(5)): U(+-1/sqrt(fan_in)), std 1/sqrt(3 fan_in)
_LINEAR_DEFAULT = "1 / sqrt(3 * fan_in)"
_MUP_HIDDEN = "sigma * sqrt(d0 / d)"
_TRUNC3 = "3 * std"


#: What torchscale's decoder runs that its entries do not build.
_TORCHSCALE_NOT = (
    "its positions (none in DecoderConfig by default: tinit's --positions applies); dropout; the LM "
    "example's sqrt(d) embedding scale is the -lm entry"
)
#: the model torchscale's Decoder builds around its deepnorm and sub-LN inits
_TORCHSCALE_MODEL = {
    "placement": "pre", "bias": True, "bias_like": ("q", "k", "v", "o", "gate", "up", "down"),
    "norm": "layernorm", "norm_eps": 1e-5, "ffn": "gelu", "tied": False, "not_modelled": _TORCHSCALE_NOT,
}  # fmt: skip
_LM_NOTE = "; the LM example's sqrt(d) embedding scale is the -lm entry"


def _all(r: Rule, roles) -> dict[str, Rule]:
    return dict.fromkeys(roles, r)


# --- optimizer rules of the parametrizations (tinit.model.param_rules applies them) ---
# Multipliers of the base lr, weight decay and Adam eps per parameter group. Output and
# branch multipliers are not here: the forward applies them (logit_mult, branch_mult).

#: microsoft/mup MuAdam (used as MuAdamW: tinit's AdamW): matrix-like parameters (two
#: infinite dimensions: the hidden matrices) lr / width_mult and, since MuAdamW leaves
#: decoupled_wd=False, weight_decay x width_mult (lr x wd held); vector-like ones
#: (embeddings, the MuReadout readout, norms, biases) keep the base values.
MUP_RULES = param_rules(
    "microsoft/mup@1981497 mup/optim.py (MuAdam, MuAdamW, decoupled_wd=False)",
    "width_mult taken as m = d/d0 for every hidden matrix (mup's is each matrix's fan-in multiplier: "
    "d_ff/d_ff0 for W_down, the same m when d_ff grows with d). decoupled_wd=True (wd unchanged) is "
    "mup's option for optimizers that decouple decay; tinit follows the default.",
    hidden_matrix={"lr": "d0 / d", "weight_decay": "d / d0"},
)


def _depth_rules(alpha: str, depth_lr: str, eps: str) -> ParamRules:
    """nanoGPT-mup's CompleteP groups (``depth_alpha_enabled``) at exponent ``alpha``:
    hidden weights lr x m^-1 (L/L0)^(alpha-1) with weight decay / m^-1 (so lr x wd holds
    in width), hidden norms and biases lr x (L/L0)^(alpha-1), embeddings and the final
    norm lr 1; Adam eps x m^-1 (L/L0)^-alpha for every group (the code scales the
    optimizer's one eps)."""
    every = {"eps": eps}
    return param_rules(
        f"EleutherAI/nanoGPT-mup@6f8bc3b model.py (branch completep: GPT.configure_optimizers, "
        f"depth_alpha_exp {alpha})",
        "Follows the code: its eps scaling reaches every group (embeddings and final norm too), and its "
        "hidden weight decay is x m (lr x wd held in width, not in depth). nanoGPT-mup ties the readout "
        "to the embedding (lr 1); tinit's untied readout takes the embedding's rule.",
        embedding=every,
        hidden_matrix={"lr": f"d0 / d * {depth_lr}" if depth_lr != "1" else "d0 / d",
                       "weight_decay": "d / d0", **every},
        hidden_vector={"lr": depth_lr, **every},
        readout=every,
        final_vector=every,
    )  # fmt: skip


COMPLETEP_RULES = _depth_rules("1", "1", "d0 / d * L0 / L")
DEPTH_MUP_RULES = _depth_rules("0.5", "(L / L0)^(-1/2)", "d0 / d * (L / L0)^(-1/2)")
#: Megatron-LM get_mup_config_overrides (Adam): hidden matrix-like parameters lr / m and
#: eps / m; embeddings, the output layer (marked is_embedding_parameter under use_mup)
#: and every vector keep the base lr and eps; weight decay is not scaled.
MEGATRON_MUP_RULES = param_rules(
    "NVIDIA/Megatron-LM@d98e8a64dd megatron/core/optimizer/__init__.py (get_mup_config_overrides); "
    "megatron/core/models/common/language_module/language_module.py (is_embedding_parameter)",
    "",
    hidden_matrix={"lr": "d0 / d", "eps": "d0 / d"},
)


def _lm(base: Scheme, name: str) -> Scheme:
    """A torchscale entry as its language-model example runs it: fairseq's
    no_scale_embedding is False there, so the decoder multiplies the embedding by sqrt(d)
    (DecoderConfig alone leaves no_scale_embedding True: x1, the base entry)."""
    return dataclasses.replace(
        base, name=name, aliases=(), embed_mult=Formula("sqrt(d)"),
        description=f"{base.description} As torchscale's language-model example runs it: the embedding "
        "output x sqrt(d) (no_scale_embedding False; DecoderConfig alone, the entry without -lm, leaves "
        "it x1).",
        upstream=(*base.upstream,
                  f"{TORCHSCALE} examples/fairseq/models/language_modeling.py (no_scale_embedding False)",
                  f"{TORCHSCALE} torchscale/architecture/decoder.py (embed_scale)"),
        not_modelled=base.not_modelled.replace(_LM_NOTE, ""),
    )  # fmt: skip


_GEMMA_NOTE = (
    "every weight N(0, sigma^2) (HF _init_weights), RMSNorm gains applied as (1 + w) with w "
    "initialised to 0, embedding output x sqrt(d), GeGLU FFN (gelu-tanh gate)"
)
#: HF Gemma 1/2/3 configs: tie_word_embeddings True, attention_bias False, rms_norm_eps 1e-6.
_GEMMA_STRUCTURE = {"tied": True, "bias": False, "norm": "rmsnorm", "norm_eps": 1e-6}

#: The torchscale entries the -lm entries derive from (their language-model example).
_DEEPNET_TORCHSCALE = scheme(
    "deepnet-torchscale",
    "DeepNet as torchscale runs it: its attention's reset_parameters is never called, so q, k, v, o keep "
    "nn.Linear's U(±1/sqrt(fan_in)), then v, o, fc1 (gate, up), fc2 (down) are divided by (8L)^(1/4); "
    "DecoderConfig's deepnorm sets encoder_normalize_before where the decoder reads "
    "decoder_normalize_before, so the decoder runs PRE-norm with alpha = (2L)^(1/4) on every addition: "
    "the stream grows like alpha^(4L) (3.7e16 at L = 12). Embedding and untied head N(1/sqrt(d)).",
    ["microsoft/torchscale torchscale/architecture/config.py DecoderConfig.postprocessing"],
    {
        **_all(rule(_LINEAR_DEFAULT, "uniform"), ("q", "k")),
        **_all(rule(f"{_LINEAR_DEFAULT} * (8 * L)^(-1/4)", "uniform"), ("v", "o", "gate", "up", "down")),
        **_all(rule("1 / sqrt(d)"), ("embed", "pos", "head")),
    },
    upstream=[
        f"{TORCHSCALE} torchscale/architecture/decoder.py (Decoder.__init__ deepnorm, "
        "DecoderLayer.residual_connection, build_output_projection)",
        f"{TORCHSCALE} torchscale/architecture/config.py (DecoderConfig.postprocessing)",
        f"{TORCHSCALE} torchscale/component/multihead_attention.py (reset_parameters, never called)",
    ],
    stream_mult="(2 * L)^(1/4)",
    **_TORCHSCALE_MODEL,
    depth_factor=("1 / (8 * L)", "(8 * L)^(-3/2)"),
    closed_form="a^(4L) v0 + s^2 sum_k a^(2(2L-k)) r_k, a = (2L)^(1/4)",
)
_MAGNETO = scheme(
    "magneto",
    "torchscale's default decoder (sub-LN, Magneto; deepnorm off): pre-norm plus a norm inside each "
    "branch, before o and before down; nn.Linear's U(±1/sqrt(fan_in)) everywhere, v, o, fc1 (gate, up) "
    "and fc2 (down) times sqrt(log 2L). The inner norm cancels v's and fc1's scale, so each branch "
    "carries o's and down's log 2L. Embedding and untied head N(1/sqrt(d)).",
    ["Wang et al. 2022 (arXiv 2210.06423)"],
    {
        **_all(rule(_LINEAR_DEFAULT, "uniform"), ("q", "k")),
        **_all(rule(f"{_LINEAR_DEFAULT} * sqrt(log(2 * L))", "uniform"), ("v", "o", "gate", "up", "down")),
        **_all(rule("1 / sqrt(d)"), ("embed", "pos", "head")),
    },
    upstream=[
        f"{TORCHSCALE} torchscale/architecture/decoder.py (Decoder.__init__ subln)",
        f"{TORCHSCALE} torchscale/component/multihead_attention.py (inner_attn_ln)",
        f"{TORCHSCALE} torchscale/component/feedforward_network.py (ffn_layernorm)",
    ],
    subln=True,
    **_TORCHSCALE_MODEL,
    aliases=("subln",),
    depth_factor=("log(2 * L)", "log(2 * L)"),
    closed_form="v0 + 2L log(2L) s^2",
)


#: Every scheme, once, in the catalogue's order: the order of `tinit inits`, `--init all`, the
#: README's table and the figures' colours (tinit.results.palette: the i-th scheme's colour
#: is the palette's i-th). The original eighteen first, then the schemes added from their
#: upstream code in the order they came: a new scheme is one entry, appended.
CATALOGUE_LIST: list[Scheme] = [
    scheme(
        "naive",
        "Every matrix N(0, sigma^2), no depth scaling (HF Llama, Qwen2, OLMo2 _init_weights).",
        ["HF transformers models/llama/modeling_llama.py _init_weights (initializer_range)"],
        upstream=[f"{HF} src/transformers/modeling_utils.py (PreTrainedModel._init_weights)"],
        closed_form="v0 + 2L s^2",
    ),
    scheme(
        "gpt2",
        "W_O and W_down N(0, sigma^2 / 2L): every stream write scaled by 1/sqrt(2L) (GPT-2).",
        ["Radford et al. 2019 sec. 2.3", "HF transformers models/gpt2/modeling_gpt2.py _init_weights"],
        {"o": rule("sigma / sqrt(2 * L)"), "down": rule("sigma / sqrt(2 * L)")},
        upstream=[
            "karpathy/nanoGPT@3adf61e1 model.py (GPT.__init__, c_proj.weight)",
            f"{HF} src/transformers/models/gpt2/modeling_gpt2.py (_init_weights)",
        ],
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
        aliases=("scaled",),
    ),
    scheme(
        "megatron",
        "linear_proj (o) and linear_fc2 (down) N(0, (sigma/sqrt(2L))^2): scaled_init_method_normal "
        "with its multiplier 2 (hybrid models use 1: not modelled); the untied output layer N(sigma).",
        ["NVIDIA/Megatron-LM megatron/core/utils.py scaled_init_method_normal"],
        {"o": rule("sigma / sqrt(2 * L)"), "down": rule("sigma / sqrt(2 * L)")},
        upstream=[
            f"{MEGATRON} megatron/core/utils.py (scaled_init_method_normal)",
            f"{MEGATRON} megatron/core/transformer/transformer_config.py (output_layer_init_method)",
        ],
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
    ),
    scheme(
        "depth-init",
        "torchtitan llama3: o, down AND up (w3) TN(0.02/sqrt(2(l+1)), ±2), q,k,v,gate (w1) "
        "TN(sigma, ±2), untied embedding N(0,1), output TN(1/sqrt(d), ±3/sqrt(d)). A tied model skips the "
        "embedding's init: the shared matrix is the output layer's TN(1/sqrt(d), ±3 std) "
        "(_EMBEDDING_SKIP_INIT). The bounds ±2 are absolute (100 std): nothing is truncated (torchtitan "
        "issue 3334). Because w3 is scaled too, the FFN branch falls like 1/(l+1)^2, so "
        "v_2L = v0 + s_attn^2 H_L/2 + s_ffn^2 H2_L/4 (H2 = sum 1/l^2).",
        [
            "pytorch/torchtitan torchtitan/models/llama3/__init__.py (_depth_init, _output_linear_init)",
            "torchtitan models/common/param_init.py depth_scaled_std",
        ],
        {
            **_all(rule("sigma", "trunc", 2), ("q", "k", "v", "gate")),
            **_all(rule("sigma / sqrt(2 * (l + 1))", "trunc", 2), ("o", "up", "down")),
            "embed": rule(1),
            "pos": rule(1),
            "head": rule("1 / sqrt(d)", "trunc", "3 / sqrt(d)"),
        },
        tied_embed=rule("1 / sqrt(d)", "trunc", "3 / sqrt(d)"),
        upstream=[
            "pytorch/torchtitan@b5bcd76c6 torchtitan/models/llama3/__init__.py (_depth_init, "
            "_output_linear_init, _EMBEDDING_INIT, _EMBEDDING_SKIP_INIT)",
            "pytorch/torchtitan@b5bcd76c6 torchtitan/models/common/param_init.py (depth_scaled_std)",
        ],
        depth_factor=("1 / (2 * (l + 1))", "1 / (2 * (l + 1))^2"),
        closed_form="v0 + s_a^2 H_L / 2 + s_f^2 H2_L / 4 (~ ln L)",
    ),
    scheme(
        "small-wang",
        "gpt-neox: small_init sqrt(2/(5d)) on embedding, q, k, v, gate, up (and untied head); "
        "wang_init 2/(L sqrt(d)) on o and down.",
        ["EleutherAI/gpt-neox megatron/model/init_functions.py small_init_init_method, wang_init_method"],
        {
            **_all(rule(_SMALL), ("embed", "pos", "q", "k", "v", "gate", "up", "head")),
            "o": rule("2 / (L * sqrt(d))"),
            "down": rule("2 / (L * sqrt(d))"),
        },
        upstream=[
            "EleutherAI/gpt-neox@ea7aefd8 megatron/model/init_functions.py (small_init_init_method, "
            "wang_init_method)"
        ],
        depth_factor=("1 / L^2", "1 / L^2"),
        closed_form="v0 + 2 s^2 / L",
    ),
    scheme(
        "mitchell",
        "OLMo mitchell: q, k, v, gate, up, embedding, head 1/sqrt(d); o 1/sqrt(2 d (l+1)); "
        "down 1/sqrt(2 d_ff (l+1)); every one truncated at 3 std.",
        ["allenai/OLMo olmo/model.py reset_parameters (InitFnType.mitchell)"],
        {
            **_all(
                rule("1 / sqrt(d)", "trunc", _TRUNC3), ("embed", "pos", "q", "k", "v", "gate", "up", "head")
            ),
            "o": rule("1 / sqrt(2 * d * (l + 1))", "trunc", _TRUNC3),
            "down": rule("1 / sqrt(2 * d_ff * (l + 1))", "trunc", _TRUNC3),
        },
        upstream=["allenai/OLMo@59a53e3f olmo/model.py (reset_parameters, InitFnType.mitchell)"],
        depth_factor=("1 / (l + 1)", "1 / (l + 1)"),
        closed_form="v0 + 2 s^2 H_L (~ ln L)",
    ),
    scheme(
        "full-megatron",
        "OLMo full_megatron: inputs sigma, o and down sigma/sqrt(2L), head 1/sqrt(d); "
        "truncated at 3 std, as OLMo's configs set init_cutoff_factor 3.",
        ["allenai/OLMo olmo/model.py reset_parameters (InitFnType.full_megatron)"],
        {
            **_all(rule("sigma", "trunc", _TRUNC3), ("q", "k", "v", "gate", "up")),
            **_all(rule("sigma_emb", "trunc", _TRUNC3), ("embed", "pos")),
            **_all(rule("sigma / sqrt(2 * L)", "trunc", _TRUNC3), ("o", "down")),
            "head": rule("1 / sqrt(d)", "trunc", _TRUNC3),
        },
        upstream=["allenai/OLMo@59a53e3f olmo/model.py (reset_parameters, InitFnType.full_megatron)"],
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
    ),
    scheme(
        "olmo2",
        "OLMo 2 (OLMo-core InitMethod.normal): every weight TN(sigma, 3 std), no depth scaling; the "
        "architecture changes instead: reordered norm x + Norm(F(x)) and QK-norm (so v_2L ~ v0 + 2L whatever "
        "the init: OLMo issue 797).",
        ["allenai/OLMo configs/official-1124/OLMo2-7B-stage1.yaml"],
        {
            **_all(rule("sigma", "trunc", _TRUNC3), ("q", "k", "v", "o", "gate", "up", "down", "head")),
            **_all(rule("sigma_emb", "trunc", _TRUNC3), ("embed", "pos")),
        },
        upstream=[
            f"{OLMO_CORE} (InitMethod.normal, init_linear)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/attention/__init__.py (Attention: q_norm, k_norm "
            "over n_heads * head_dim unless use_head_qk_norm)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/transformer/config.py (olmo2_*: qk_norm, "
            "layer_norm_eps 1e-6, rope_theta 500000; tie_word_embeddings False)",
        ],
        placement="reordered",
        qk_norm=True,
        qk_norm_span="full",
        tied=False,
        bias=False,
        norm="rmsnorm",
        norm_eps=1e-6,
        rope_base=500000.0,
        not_modelled="clip_qkv (off in OLMo 2's configs); document masking",
        closed_form="v0 + 2L (normed branches)",
    ),
    scheme(
        "deepnet",
        "DeepNet (the paper, decoder-only): Xavier normal with gain 1 on q, k and gain beta = (8L)^(-1/4) on "
        "v, o and the FFN (gate and up both count as fc1); post-norm with x <- Norm(alpha x + F(x)), alpha = "
        "(2L)^(1/4). Embedding and untied head N(1/sqrt(d)) as torchscale (the paper leaves them open). "
        "Theory: attention branch variance x beta^4, SwiGLU x ~beta^6 (silu taken as homogeneous).",
        ["Wang et al. 2022 (arXiv 2203.00555), Algorithm 1 and Table 1"],
        {
            **_all(rule(_XAVIER), ("q", "k")),
            **_all(rule(f"{_XAVIER} * (8 * L)^(-1/4)"), ("v", "o", "gate", "up", "down")),
            **_all(rule("1 / sqrt(d)"), ("embed", "pos", "head")),
        },
        upstream=[
            f"{TORCHSCALE} torchscale/architecture/decoder.py (DecoderLayer.alpha, Decoder.__init__ "
            "deepnorm init_scale) for alpha and beta; the weights as the paper"
        ],
        stream_mult="(2 * L)^(1/4)",
        placement="post",
        depth_factor=("1 / (8 * L)", "(8 * L)^(-3/2)"),
        closed_form="alpha^2 + s^2 (8L)^(-3/2) (post)",
    ),
    scheme(
        "t-fixup",
        "T-Fixup (decoder), no norms: Xavier uniform (gain 1/sqrt(2) on q, k, v), then o, fc1 "
        "(gate, up), fc2 (down) times (9L)^(-1/4) and v times sqrt(2) (9L)^(-1/4); embedding N(0, 1/d) times "
        "(9L)^(-1/4), and fairseq multiplies the embedding output by sqrt(d) (embed_scale, on by default); "
        "untied output N(1/sqrt(d)).",
        ["Huang et al. 2020 (ICML)"],
        {
            **_all(rule(f"{_XAVIER} / sqrt(2)", "uniform"), ("q", "k")),
            **_all(rule(f"{_XAVIER} * (9 * L)^(-1/4)", "uniform"), ("v", "o", "gate", "up", "down")),
            **_all(rule("(9 * L)^(-1/4) / sqrt(d)"), ("embed", "pos")),
            "head": rule("1 / sqrt(d)"),
        },
        upstream=[
            "layer6ai-labs/T-Fixup@b17e166 fairseq/models/transformer.py (TransformerDecoder: Tfixup "
            "embedding scale, embed_scale, embed_out; Embedding)",
            "layer6ai-labs/T-Fixup@b17e166 fairseq/modules/transformer_layer.py (fixup_initialization)",
        ],
        embed_mult="sqrt(d)",
        placement="none",
        bias=True,
        bias_like=("q", "k", "v"),
        bias_rule=rule(_LINEAR_DEFAULT, "uniform"),
        not_modelled="fairseq's sinusoidal positions (added after the sqrt(d) scale; tinit runs "
        "--positions); its ReLU FFN (tinit builds --ffn); the output projection's bias (fairseq has none; "
        "tinit's untied head with --bias has one at 0). q, k, v keep nn.Linear's biases "
        "U(±1/sqrt(fan_in)); out_proj's and the FFN's are 0 (fairseq's Linear)",
        depth_factor=("1 / (9 * L)", "(9 * L)^(-3/2)"),
        closed_form="v0 prod_k (1 + rho_k r_k) (approximate; bounded in L)",
    ),
    scheme(
        "rezero",
        "ReZero: no norms; one learned scalar per block, shared by its two branches, initialised "
        "to 0: every block starts as the identity. Matrices keep torch's defaults: q, k, v Xavier uniform "
        "over nn.MultiheadAttention's packed (3d x d) in_proj, std sqrt(1/(2d)); o and the FFN nn.Linear's "
        "U(±1/sqrt(fan_in)). Embedding and head are not in its code: naive.",
        ["Bachlechner et al. 2020"],
        {
            **_all(rule("sqrt(1 / (2 * d))", "uniform"), ("q", "k", "v")),
            **_all(rule(_LINEAR_DEFAULT, "uniform"), ("o", "gate", "up", "down")),
        },
        upstream=[
            "majumderb/rezero@e2c94a8 rezero/transformer/rztx.py (RZTXEncoderLayer: resweight, "
            "MultiheadAttention, Linear)"
        ],
        branch_mult="0",
        branch_learned=True,
        placement="none",
        bias=True,
        bias_like=("gate", "up", "down"),
        not_modelled="its FFN's ReLU (tinit builds --ffn: linear1, linear2 as up, down); its encoder's "
        "bidirectional attention (--attention); nn.MultiheadAttention's in_proj and out_proj biases are 0 "
        "(as tinit's)",
        closed_form="v0",
    ),
    scheme(
        "zero-out",
        "W_O and W_down exactly 0: every block starts as the identity (nanochat; modded-nanogpt "
        "issue 10 reports it beat 1/sqrt(2L)).",
        ["karpathy/nanochat nanochat/gpt.py init_weights"],
        {"o": rule(0, "zero"), "down": rule(0, "zero")},
        upstream=[f"{NANOCHAT} (GPT.init_weights: c_proj zeros)"],
        depth_factor=("0", "0"),
        closed_form="v0",
    ),
    scheme(
        "nanochat",
        "nanochat: embedding N(0, 0.8^2) (its docstring says 1.0) then RMS-normalised; untied "
        "head N(0, 0.001^2) (it never ties); RoPE base 1e5; q, k, v U(std 1/sqrt(d)), c_fc (up) 0.4 x "
        "that, o and down 0; relu^2 MLP of "
        "width 4d; QK-norm then q, k x 1.2; before block l x <- lambda_l x + mu_l x0 (x0 the normed "
        "embedding); backout: x - 0.2 x_mid (x_mid after block L//2) before the final norm; logits "
        "15 tanh(z / 15). Its RMSNorm is weightless: tinit's has a gain of 1 (the same at init).",
        ["karpathy/nanochat nanochat/gpt.py"],
        {
            "embed": rule(0.8),
            "pos": rule(0.8),
            "head": rule(0.001),
            **_all(rule("1 / sqrt(d)", "uniform"), ("q", "k", "v")),
            **_all(rule("0.4 / sqrt(d)", "uniform"), ("gate", "up")),
            "o": rule(0, "zero"),
            "down": rule(0, "zero"),
        },
        upstream=[f"{NANOCHAT} (GPT.init_weights, GPT.forward, CausalSelfAttention.forward, MLP)"],
        x0_mix=("1.15 - 0.10 * l / max(L - 1, 1)", "0.20 - 0.15 * l / max(L - 1, 1)"),
        embed_norm=True,
        backout="0.2",
        qk_gain="1.2",
        logit_softcap="15",
        ffn="relu2",
        d_ff="4 * d",
        placement="pre",
        qk_norm=True,
        tied=False,
        bias=False,
        rope_base=100000.0,
        not_modelled="the value embeddings of alternate layers; the smear gate (0 at init); the "
        "sliding-window pattern SSSL (its short window, a quarter of the context rounded up to 128, "
        "does not act on tinit's sequences up to that length); the RMSNorm eps of the dtype (tinit: "
        "--norm's 1e-6)",
        depth_factor=("0", "0"),
        closed_form="(c_L - 0.2 c_mid)^2 v0, c <- lambda c + mu",
    ),
    scheme(
        "mup",
        "muP as the mup library applies it to a model at tinit's sigma (m = d/d0): every hidden matrix "
        "mup.init.normal_(std=sigma) (sigma at the base width d0, sigma/sqrt(m) at d), embeddings unchanged "
        "(vector-like), q zero and an untied readout zero (mup's README: MuReadout(readout_zero_init=True)), "
        "logits x 1/m (MuReadout), attention q.k/d_h; optimizer rules (MuAdamW): hidden matrices lr / m, "
        "weight decay x m. With a tied head the readout is the embedding at sigma_emb (no sqrt(m) rescale). "
        "Not mup's Transformer example's constants: that is mup-example.",
        ["Yang et al. 2022 (Tensor Programs V)"],
        {
            **_all(rule(_MUP_HIDDEN), ("k", "v", "o", "gate", "up", "down")),
            "q": rule(0, "zero"),
            "head": rule(0, "zero"),
        },
        upstream=[
            f"{MUP} mup/init.py (normal_: std x width_mult^-1/2 for a matrix with two infinite dimensions)",
            f"{MUP} mup/layer.py (MuReadout: readout_zero_init, x output_mult / width_mult)",
            f"{MUP} mup/optim.py (MuAdamW)",
            f"{MUP} README.md (Coord Check: zero readout and query at init)",
        ],
        logit_mult="d0 / d",
        attn_scale="1 / d_h",
        closed_form="v0 + 2L s^2",
        param_rules=MUP_RULES,
    ),
    scheme(
        "completep",
        "CompleteP (alpha = 1): muP's hidden stds (q not zeroed, as nanoGPT-mup draws q like k), no "
        "1/sqrt(2L), every branch times (L/L0)^-1; logits x 1/m, q.k/d_h.",
        ["Dey et al. 2025 (arXiv 2505.01618)"],
        {**_all(rule(_MUP_HIDDEN), ("q", "k", "v", "o", "gate", "up", "down"))},
        upstream=["EleutherAI/nanoGPT-mup@6f8bc3b model.py (branch completep: Block, _init_weights)"],
        branch_mult="(L / L0)^(-1)",
        logit_mult="d0 / d",
        attn_scale="1 / d_h",
        closed_form="v0 + 2 s^2 L0^2 / L",
        param_rules=COMPLETEP_RULES,
    ),
    scheme(
        "depth-mup",
        "Depth-muP (alpha = 1/2): as completep with every branch times (L/L0)^(-1/2).",
        ["Yang et al. 2023 (arXiv 2310.02244)"],
        {**_all(rule(_MUP_HIDDEN), ("q", "k", "v", "o", "gate", "up", "down"))},
        upstream=["EleutherAI/nanoGPT-mup@6f8bc3b model.py (branch completep, depth_alpha_exp 0.5)"],
        branch_mult="(L / L0)^(-1/2)",
        logit_mult="d0 / d",
        attn_scale="1 / d_h",
        closed_form="v0 + 2 s^2 L0",
        param_rules=DEPTH_MUP_RULES,
    ),
    scheme(
        "gemma",
        f"Gemma: {_GEMMA_NOTE}; pre-norm.",
        ["HF transformers models/gemma/modeling_gemma.py"],
        upstream=[
            f"{HF} src/transformers/models/gemma/modeling_gemma.py (GemmaRMSNorm, GemmaModel, "
            "GemmaPreTrainedModel._init_weights)"
        ],
        embed_mult="sqrt(d)",
        norm_offset=1.0,
        ffn="geglu",
        placement="pre",
        **_GEMMA_STRUCTURE,
        closed_form="v0 + 2L s^2 (v0 = d sigma_emb^2)",
    ),
    scheme(
        "scaled-embed",
        "Takase et al. 2023 as Modalities runs it (std 'auto'): one std sqrt(2/(5d)) for every "
        "matrix ('plain'), o and down that std / sqrt(2L) ('scaled'), embeddings and an untied lm_head "
        "std sqrt(0.4) ('scaled_embed'). With a numeric std (Modalities' other choice) write the std in "
        "a --init-file.",
        ["Takase et al. 2023 (arXiv 2312.16903)"],
        {
            **_all(rule(_SMALL), ("q", "k", "v", "gate", "up")),
            **_all(rule(f"{_SMALL} / sqrt(2 * L)"), ("o", "down")),
            **_all(rule("sqrt(0.4)"), ("embed", "pos", "head")),
        },
        upstream=[
            "Modalities/modalities@bf0e6d32 src/modalities/nn/model_initialization/"
            "composed_initialization.py (get_composed_model_initializer)",
            "Modalities/modalities@bf0e6d32 src/modalities/nn/model_initialization/"
            "initialization_routines.py, parameter_name_filters.py",
        ],
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
    ),
    _DEEPNET_TORCHSCALE,
    _MAGNETO,
    scheme(
        "megatron-mup",
        "Megatron-LM with use_mup (m = d/d0, d0 = mup_base_hidden_size): hidden matrices sigma/sqrt(m), "
        "o and "
        "down sigma/(sqrt(2L) sqrt(m)), embedding and untied output layer N(sigma) (embedding_init_method), "
        "logits x 1/m (mup_output_mult), softmax scale 1/kv_channels (mup_attn_scale_power 1).",
        ["NVIDIA/Megatron-LM megatron/core/utils.py mup_scaled_init_method_normal"],
        {
            **_all(rule(_MUP_HIDDEN), ("q", "k", "v", "gate", "up")),
            **_all(rule(f"{_MUP_HIDDEN} / sqrt(2 * L)"), ("o", "down")),
        },
        upstream=[
            f"{MEGATRON} megatron/core/transformer/transformer_config.py (__post_init__ use_mup)",
            f"{MEGATRON} megatron/core/utils.py (mup_scaled_init_method_normal)",
            f"{MEGATRON} megatron/core/models/gpt/gpt_model.py (output_layer init_method)",
        ],
        logit_mult="d0 / d",
        attn_scale="1 / d_h",
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
        param_rules=MEGATRON_MUP_RULES,
    ),
    scheme(
        "olmo-llama",
        "OLMo-core InitMethod.llama: every weight TN(sigma, ±3 std); w_out (o), w3 (up) and w2 "
        "(down) sigma/sqrt(2L); embedding N(0, 1); final w_out (head) TN(1/sqrt(d), ±3 std). Up and down "
        "both scaled: the FFN branch falls like 1/(2L)^2.",
        ["allenai/OLMo-core nn/transformer/init.py"],
        {
            **_all(rule("sigma", "trunc", _TRUNC3), ("q", "k", "v", "gate")),
            **_all(rule("sigma / sqrt(2 * L)", "trunc", _TRUNC3), ("o", "up", "down")),
            **_all(rule(1), ("embed", "pos")),
            "head": rule("1 / sqrt(d)", "trunc", _TRUNC3),
        },
        upstream=[
            f"{OLMO_CORE} (InitMethod.llama: init_embeddings, init_feed_forward, init_final_w_out)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/attention/__init__.py (Attention.init_weights)",
        ],
        depth_factor=("1 / (2 * L)", "1 / (2 * L)^2"),
        closed_form="v0 + s_a^2 / 2 + s_f^2 / (4L)",
    ),
    scheme(
        "olmo-llama-depth",
        "OLMo-core InitMethod.llama_depth: as olmo-llama with torchtitan's per-layer rule, "
        "o, up, down sigma/sqrt(2(l+1)), truncated at ±3 std relative (torchtitan's ±2 is absolute).",
        ["allenai/OLMo-core nn/transformer/init.py"],
        {
            **_all(rule("sigma", "trunc", _TRUNC3), ("q", "k", "v", "gate")),
            **_all(rule("sigma / sqrt(2 * (l + 1))", "trunc", _TRUNC3), ("o", "up", "down")),
            **_all(rule(1), ("embed", "pos")),
            "head": rule("1 / sqrt(d)", "trunc", _TRUNC3),
        },
        upstream=[
            f"{OLMO_CORE} (InitMethod.llama_depth)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/attention/__init__.py (Attention.init_weights)",
        ],
        depth_factor=("1 / (2 * (l + 1))", "1 / (2 * (l + 1))^2"),
        closed_form="v0 + s_a^2 H_L / 2 + s_f^2 H2_L / 4 (~ ln L)",
    ),
    scheme(
        "olmo-fan-in",
        "OLMo-core InitMethod.fan_in: every matrix TN(1/sqrt(fan_in), ±3 std) (down: "
        "1/sqrt(d_ff)), no depth scaling; embedding N(0, 1); head TN(1/sqrt(d), ±3 std).",
        ["allenai/OLMo-core nn/transformer/init.py"],
        {
            **_all(rule("1 / sqrt(fan_in)", "trunc", _TRUNC3), ("q", "k", "v", "o", "gate", "up", "down")),
            **_all(rule(1), ("embed", "pos")),
            "head": rule("1 / sqrt(d)", "trunc", _TRUNC3),
        },
        upstream=[
            f"{OLMO_CORE} (InitMethod.fan_in)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/attention/__init__.py (Attention.init_weights)",
        ],
        closed_form="v0 + 2L s^2",
    ),
    scheme(
        "olmo-normalized",
        "OLMo-core InitMethod.normalized (nGPT's init): q, k, v, gate, up TN(1/sqrt(d), ±3 "
        "std); o and down TN(1/sqrt(d)/sqrt(2L)); embedding N(1/sqrt(d)); head TN(1/sqrt(d)); never tied "
        "(OLMo-core refuses to tie the normalized transformer). Only the init formulas: OLMo-core's "
        "NormalizedTransformer.init_weights then unit-normalises every matrix (rows; o and down by column: "
        "every matrix at std 1/sqrt(d), 0.0361 at d 768) and runs the nGPT forward; tinit builds neither, "
        "so its o and down keep the formula's 1/sqrt(2Ld).",
        ["allenai/OLMo-core nn/transformer/init.py"],
        {
            **_all(rule("1 / sqrt(d)", "trunc", _TRUNC3), ("q", "k", "v", "gate", "up", "head")),
            **_all(rule("1 / sqrt(d) / sqrt(2 * L)", "trunc", _TRUNC3), ("o", "down")),
            **_all(rule("1 / sqrt(d)"), ("embed", "pos")),
        },
        upstream=[
            f"{OLMO_CORE} (InitMethod.normalized)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/attention/__init__.py (Attention.init_weights)",
            "allenai/OLMo-core@fa6c5014c src/olmo_core/nn/transformer/config.py (tie_word_embeddings refused "
            "for the normalized transformer)",
        ],
        tied=False,
        not_modelled="NormalizedTransformer.init_weights' unit-normalisation of every matrix after the init "
        "(std 1/sqrt(d) everywhere); the nGPT forward (normalised streams, eigen learning rates, scaled "
        "logits)",
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"),
        closed_form="v0 + s^2",
    ),
    scheme(
        "gemma2",
        f"Gemma 2: {_GEMMA_NOTE}; sandwich norms (input and post-attention, pre- and "
        "post-feedforward); attention scale query_pre_attn_scalar^-1/2 = 1/16 (256, its default, whatever "
        "d_h); attention logits 50 tanh(z / 50), final logits 30 tanh(z / 30). Its alternating sliding "
        "window (4096) does not act at tinit's lengths.",
        ["Gemma Team 2024 (arXiv 2408.00118)"],
        upstream=[
            f"{HF} src/transformers/models/gemma2/modeling_gemma2.py (Gemma2DecoderLayer, "
            "Gemma2Attention, Gemma2ForCausalLM, Gemma2PreTrainedModel._init_weights)"
        ],
        embed_mult="sqrt(d)",
        norm_offset=1.0,
        ffn="geglu",
        attn_scale="1 / sqrt(256)",
        attn_softcap="50",
        logit_softcap="30",
        placement="sandwich",
        **_GEMMA_STRUCTURE,
        not_modelled="the alternating sliding window (4096: does not act at tinit's lengths)",
        closed_form="v0 + 2L (normed branches; v0 = d sigma_emb^2)",
    ),
    scheme(
        "gemma3",
        f"Gemma 3 (text): {_GEMMA_NOTE}; sandwich norms; QK-norm (its own (1 + w) RMSNorm over d_h); "
        "attention scale query_pre_attn_scalar^-1/2 = 1/16; no soft-caps.",
        ["Gemma Team 2025 (arXiv 2503.19786)"],
        upstream=[
            f"{HF} src/transformers/models/gemma3/modeling_gemma3.py (Gemma3DecoderLayer, "
            "Gemma3Attention q_norm/k_norm, Gemma3PreTrainedModel._init_weights)"
        ],
        embed_mult="sqrt(d)",
        norm_offset=1.0,
        ffn="geglu",
        attn_scale="1 / sqrt(256)",
        placement="sandwich",
        qk_norm=True,
        **_GEMMA_STRUCTURE,
        not_modelled="its two RoPE bases (local 10000, global 1e6: tinit uses --rope-base's one); the "
        "sliding window of its local layers (does not act at tinit's lengths)",
        closed_form="v0 + 2L (normed branches; v0 = d sigma_emb^2)",
    ),
    scheme(
        "mup-example",
        "microsoft/mup's examples/Transformer as it runs (main.py defaults: init_var 1, d0 = 256, "
        "MuAdam): k, v, o, up, down N(0, init_var/d), 1/sqrt(d) at every width (sigma is not used); q "
        "zero; embedding N(0, 1) (nn.Embedding's default); untied readout zero (init_weights); tied, "
        "set_base_shapes rescales the shared matrix (MuSharedReadout) to N(0, d/d0); logits x 1/m; "
        "q.k/d_h; optimizer rules MuAdam's. Its model: post-norm LayerNorm blocks (torch's "
        "TransformerEncoder, no final norm), a ReLU FFN of width d, no biases but LayerNorm's, untied by "
        "default. Not modelled: its fixed sinusoidal positions (tinit runs --positions), its dropout 0.2, "
        "and its layers being copies of one layer at init (TransformerEncoder deep-copies it; tinit "
        "draws each layer).",
        ["Yang et al. 2022 (Tensor Programs V)", "microsoft/mup examples/Transformer"],
        {
            "embed": rule(1),
            **_all(rule("1 / sqrt(d)"), ("k", "v", "o", "up", "down")),
            "q": rule(0, "zero"),
            "head": rule(0, "zero"),
        },
        upstream=[
            f"{MUP} examples/Transformer/model.py (MultiheadAttention._reset_parameters, "
            "TransformerEncoderLayer.reset_parameters, TransformerModel.__init__, init_weights)",
            f"{MUP} examples/Transformer/main.py (argument defaults, coord_check, --save_base_shapes)",
            f"{MUP} mup/layer.py (MuReadout, MuSharedReadout, _rescale_parameters)",
            f"{MUP} mup/shape.py (set_base_shapes)",
        ],
        tied_embed=rule("sqrt(d / d0)"),
        logit_mult="d0 / d",
        attn_scale="1 / d_h",
        ffn="relu",
        d_ff="d",
        placement="post",
        tied=False,
        bias=False,
        norm="layernorm",
        norm_eps=1e-5,
        not_modelled="its fixed sinusoidal positions (tinit runs --positions); dropout 0.2; its layers "
        "being copies of one layer at init (TransformerEncoder deep-copies it; tinit draws each layer)",
        closed_form="v0 + 2L s^2",
        param_rules=MUP_RULES,
    ),
    _lm(_DEEPNET_TORCHSCALE, "deepnet-torchscale-lm"),
    _lm(_MAGNETO, "magneto-lm"),
]

# --- looking schemes up -------------------------------------------

CATALOGUE: dict[str, Scheme] = {s.name: s for s in CATALOGUE_LIST}
assert len(CATALOGUE) == len(CATALOGUE_LIST), "a scheme's name is in the catalogue twice"
ALIASES = {alias: s.name for s in CATALOGUE_LIST for alias in s.aliases}


def names(custom: Iterable[Scheme] | bool = ()) -> list[str]:
    """The catalogue's names, then those of the user's schemes ``custom`` (a bool, as
    older callers pass, means none: user schemes live in the run's InitConfig)."""
    custom = () if isinstance(custom, bool) else custom
    return list(CATALOGUE) + [s.name for s in custom if s.name not in CATALOGUE]


def names_and_aliases(custom: Iterable[Scheme] = ()) -> list[str]:
    """Every name --init accepts for one scheme: :func:`names`, then the aliases."""
    return [*names(custom), *ALIASES]


def alias_note() -> str:
    """The aliases, as help texts list them: ``scaled = gpt2``."""
    return ", ".join(f"{alias} = {name}" for alias, name in ALIASES.items())


def known(name: str, custom: Iterable[Scheme] = ()) -> bool:
    return name in CATALOGUE or name in ALIASES or any(s.name == name for s in custom)


def get_scheme(name: str, custom: Iterable[Scheme] = ()) -> Scheme:
    """The scheme called ``name`` (an alias such as ``scaled`` gives ``gpt2``): the
    catalogue's, else one of the user's schemes ``custom`` (carried by the run's
    InitConfig). Raises KeyError naming the choices."""
    name = ALIASES.get(name, name)
    if name in CATALOGUE:
        return CATALOGUE[name]
    custom = tuple(custom)
    for s in custom:
        if s.name == name:
            return s
    raise KeyError(f"unknown init scheme {name!r}; choose from {', '.join(names(custom))}")


#: Words --init reads as lists of schemes, not as a scheme's name.
RESERVED = ("all", "both")


def check_user_scheme(s: Scheme) -> Scheme:
    """A user's scheme may not take a catalogue name or alias, nor a word --init reserves
    (``all``, ``both``)."""
    if s.name in CATALOGUE or s.name in ALIASES:
        raise FormulaError(f"scheme name {s.name!r} is taken by the catalogue")
    if s.name.lower() in RESERVED:
        raise FormulaError(f"scheme name {s.name!r} is taken: --init reads it as a list of schemes "
                           f"({', '.join(RESERVED)})")  # fmt: skip
    return s


def parse_init_list(spec: str, custom: Iterable[Scheme] = ()) -> tuple[str, ...]:
    """``naive,gpt2``, ``all`` (the catalogue and the user's schemes) or ``both``
    (naive,scaled). Raises KeyError naming the unknown scheme, or the two names of one
    scheme given both (``gpt2,scaled``: the same scheme would run twice under two names).
    A scheme that ``all`` or ``both`` also brings runs once, under the first name it came by."""
    custom = tuple(custom)
    items = [s.strip() for s in spec.split(",") if s.strip()]
    out: dict[str, str] = {}  # scheme -> the name it runs under
    named: dict[str, str] = {}  # scheme -> the name the user wrote for it
    for item in items:
        if item in RESERVED:
            for name in names(custom) if item == "all" else ["naive", "scaled"]:
                out.setdefault(ALIASES.get(name, name), name)
        elif known(item, custom):
            canonical = ALIASES.get(item, item)
            if named.get(canonical, item) != item:
                raise KeyError(f"{named[canonical]!r} and {item!r} are the same scheme "
                               f"({'/'.join(sorted({named[canonical], item}))}): give one")  # fmt: skip
            named[canonical] = item
            out.setdefault(canonical, item)
        else:
            raise KeyError(f"unknown init scheme {item!r}; choose from {', '.join(names(custom))}, all, both")
    if not out:
        raise KeyError(f"no init scheme given; choose from {', '.join(names(custom))}, all, both")
    return tuple(out.values())


def placements_for(name: str, default: tuple[str, ...], custom: Iterable[Scheme] = ()) -> tuple[str, ...]:
    """The norm placements a scheme runs in when the user did not choose: its presumed
    one, else ``default``."""
    p = get_scheme(name, custom).placement
    return (p,) if p is not None else tuple(default)
