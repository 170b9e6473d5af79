"""The same transformer as Flax NNX modules: what a library adds, and what it costs.

sessions/model/transformer.py keeps the weights in a plain dict and the forward pass in
pure functions. Flax NNX, the API the Flax team recommends, keeps each weight
inside the module that uses it, as an `nnx.Param`, and adds three things:

- module state: a model is a Python object whose attributes are its weights,
  `model.layers[0].attn.wq`; `nnx.jit` / `nnx.value_and_grad` split it into
  (structure, arrays) at each call and merge it back, and an `nnx.Optimizer`
  updates it in place.
- RNG streams: `nnx.Rngs(params=seed)` hands every initialiser a fresh key
  from a named stream, so no key is threaded or split by hand (a `dropout`
  stream would sit beside it; this model has no dropout).
- partition metadata beside the weights: each Param carries its sharding
  names (`nnx.with_partitioning`), the same rules as sessions/shard/sharding.py's
  PARAM_SPECS; `nnx.get_partition_spec` reads them back, and under
  `jax.set_mesh` each weight is created already sharded.

The arithmetic is sessions/model/transformer.py's own (`dense`, the attention and the
positions), so the two models give the same logits and `from_params` /
`to_params` convert one into the other. nnx.Linear and nnx.Einsum would
contract [B, S, E] with [E, F] without first folding B·S into one dimension,
which on a CPU is the slower program (see sessions/model/transformer.py's `dense`), and the
timing in scripts/bench.py would then measure that, not the library.

The tied embedding is one `nnx.Embed` read twice: its `embedding` Param looks
tokens up and is the output projection, giving logits in the compute dtype, as
`Embed.attend` and sessions/model/transformer.py's `unembed` do.

It is session 2's model only: session 5's switches (grouped-query attention,
rotary positions, the gated MLP, untied embeddings) live in sessions/model/transformer.py
alone, and a config that sets one is refused.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sessions.errors import UsageError
from sessions.model.attention import attention
from sessions.model.config import ModelConfig
from sessions.model.positions import add_positions
from sessions.model.transformer import cross_entropy, dense
from sessions.shard.sharding import PARAM_SPECS, constrain


def partitioned(init, name):
    """The initialiser `init`, its weights carrying the sharding names of PARAM_SPECS[name].

    Under a mesh (`jax.set_mesh`) each weight is sharded as it is created; with
    none, Flax would refuse to create it (its eager sharding wants a mesh), so
    the names are then only recorded, as constrain() does nothing without one."""
    mesh_set = not jax.sharding.get_abstract_mesh().empty
    return nnx.with_partitioning(init, tuple(PARAM_SPECS[name]), eager_sharding=mesh_set)


def param(rngs, name, shape, std):
    """A float32 Param drawn from the `params` stream, carrying its sharding names."""
    init = partitioned(nnx.initializers.normal(std), name)
    return nnx.Param(init(rngs.params(), shape, jnp.float32))


def norm(cfg, name, rngs):
    """Pre-norm with a learned scale (initially ones), sharded by the rule for `name`."""
    ones = partitioned(nnx.initializers.ones_init(), name)
    return nnx.RMSNorm(
        cfg.embed, epsilon=1e-6, dtype=jnp.dtype(cfg.dtype), scale_init=ones, rngs=rngs
    )


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        E, H, D = cfg.embed, cfg.heads, cfg.head_dim
        residual_scale = (2 * cfg.layers) ** -0.5  # GPT-2's, as in init_params
        self.wq = param(rngs, "wq", (E, H, D), E**-0.5)
        self.wk = param(rngs, "wk", (E, H, D), E**-0.5)
        self.wv = param(rngs, "wv", (E, H, D), E**-0.5)
        self.wo = param(rngs, "wo", (H, D, E), (H * D) ** -0.5 * residual_scale)
        self.cfg = cfg

    def __call__(self, x, segment_ids=None):
        """x: [B, S, E] -> [B, S, E]."""

        def w(p):  # the float32 master weight, cast
            return p[...].astype(x.dtype)

        q = constrain(dense(x, w(self.wq)), "BSHD")  # "BSE,EHD->BSHD"
        k = constrain(dense(x, w(self.wk)), "BSHD")
        v = constrain(dense(x, w(self.wv)), "BSHD")
        out = attention(q, k, v, segment_ids, impl=self.cfg.attention_impl)
        return constrain(dense(out, w(self.wo), n_in=2), "BSE")  # "BSHD,HDE->BSE"


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        E, F = cfg.embed, cfg.ff
        self.w_in = param(rngs, "w_in", (E, F), E**-0.5)
        self.w_out = param(rngs, "w_out", (F, E), F**-0.5 * (2 * cfg.layers) ** -0.5)

    def __call__(self, x):
        """x: [B, S, E] -> [B, S, E]."""
        h = jax.nn.relu(constrain(dense(x, self.w_in[...].astype(x.dtype)), "BSF"))
        return constrain(dense(h, self.w_out[...].astype(x.dtype)), "BSE")


class Block(nnx.Module):
    """x + attention(norm(x)), then + mlp(norm(...)): pre-norm residual."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = norm(cfg, "attn_norm", rngs) if cfg.attention else None
        self.attn = Attention(cfg, rngs) if cfg.attention else None
        self.mlp_norm = norm(cfg, "mlp_norm", rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, segment_ids=None):
        if self.attn is not None:
            x = x + self.attn(self.attn_norm(x), segment_ids)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nnx.Module):
    """tokens: int [B, S] -> logits [B, S, V], as sessions.model.transformer.forward."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        if cfg.n_kv_heads != cfg.heads or cfg.rope or cfg.gated or not cfg.tied:
            raise UsageError(
                "the Flax model is session 2's model: no --kv-heads, --rope, --gated or "
                "--untied (sessions/model/transformer.py has them)"
            )
        E, V = cfg.embed, cfg.vocab
        self.cfg = cfg
        embed_init = nnx.initializers.normal(E**-0.5)  # std 1/sqrt(E): see init_params
        # No compute dtype on the Embed: nnx.Embed would cast its table before the
        # lookup, and the lookup's gradient must sum in float32 (model.py, embed).
        self.embed = nnx.Embed(V, E, embedding_init=partitioned(embed_init, "embed"), rngs=rngs)
        self.pos = param(rngs, "pos", (cfg.seq, E), 0.01) if cfg.positions else None
        # nnx.List, not a plain list: NNX then treats the blocks as state to trace.
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.final_norm = norm(cfg, "final_norm", rngs)

    def __call__(self, tokens, segment_ids=None):
        dtype = jnp.dtype(self.cfg.dtype)
        x = self.embed(tokens).astype(dtype)  # [B, S, E]: a gather from the float32 table
        if self.pos is not None:
            x = add_positions(x, self.pos[...].astype(dtype))
        x = constrain(x, "BSE")
        for block in self.layers:
            x = block(x, segment_ids)
        x = self.final_norm(x)
        table = self.embed.embedding[...].astype(dtype)  # the tied output projection
        logits = jnp.einsum("BSE,VE->BSV", x, table)
        return constrain(logits, "BSV")


def weights(model):
    """(path in our param dict, the nnx Variable holding that weight), for each weight."""
    pairs = [(("embed",), model.embed.embedding), (("final_norm",), model.final_norm.scale)]
    if model.pos is not None:
        pairs.append((("pos",), model.pos))
    for i, block in enumerate(model.layers):
        pairs += [(("layers", i, "mlp_norm"), block.mlp_norm.scale)]
        pairs += [(("layers", i, n), getattr(block.mlp, n)) for n in ("w_in", "w_out")]
        if block.attn is not None:
            pairs += [(("layers", i, "attn_norm"), block.attn_norm.scale)]
            pairs += [(("layers", i, n), getattr(block.attn, n)) for n in ("wq", "wk", "wv", "wo")]
    return pairs


def from_params(params, cfg: ModelConfig):
    """Our param dict -> a Transformer holding the same arrays (not copies)."""
    # eval_shape builds the module tree from shapes alone: no weight is drawn twice.
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
    for path, variable in weights(model):
        value = functools.reduce(lambda tree, k: tree[k], path, params)
        assert value.shape == variable.shape, (path, value.shape, variable.shape)
        variable.set_value(value)
    return model


def to_params(model):
    """A Transformer -> our param dict (the same arrays), as init_params builds it."""
    params = {"layers": [{} for _ in model.layers]}
    for path, variable in weights(model):
        *parents, name = path
        functools.reduce(lambda tree, k: tree[k], parents, params)[name] = variable[...]
    return params


def make_flax_train_step():
    """The training step as NNX writes it: (model, nnx.Optimizer, batch) -> metrics,
    the model and optimizer updated in place. The same loss, gradient and optax
    update as sessions.train.step.train_step, and like it the old weights' buffers
    are donated to the new ones."""

    @functools.partial(nnx.jit, donate_argnums=(0, 1))
    def step(model, opt, batch):
        def loss_fn(model):
            return cross_entropy(model(batch["inputs"]), batch["targets"])

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return step


def make_flax_optimizer(model, tx):
    """An nnx.Optimizer over the model's Params with the optax transform `tx`."""
    return nnx.Optimizer(model, tx, wrt=nnx.Param)
