"""Our Llama implementation against transformers' LlamaForCausalLM on the shipped weights."""

import pytest
import torch

from veil.engine.reference import build_reference, reference_greedy


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per row, in nats."""
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def test_logits_match_reference(ckpt, full_model, chat_prompts):
    ref = build_reference(ckpt)
    kls = []
    for ids in chat_prompts:
        with torch.inference_mode():
            ref_logits = ref(input_ids=torch.tensor([ids])).logits[0]
            h, _ = full_model.forward_layers(full_model.embed(torch.tensor(ids)), torch.arange(len(ids)),
                                             [None] * ckpt.config.num_layers)
            ours = full_model.logits(h)
        kls.append(_kl(ref_logits, ours))
    mean_kl = torch.cat(kls).mean().item()
    print(f"mean KL(reference || veil) over {sum(len(k) for k in kls)} positions: {mean_kl:.3e}")
    assert mean_kl < 1e-6


@pytest.mark.filterwarnings("error::FutureWarning")  # a keyword transformers is about to drop fails now
def test_greedy_matches_reference(ckpt, chat_prompts, local_greedy):
    ref = build_reference(ckpt)
    for ids, ours in zip(chat_prompts, local_greedy, strict=True):
        assert len(ours) == 32
        assert reference_greedy(ref, ids, 32) == ours


def test_default_answer_is_sensible(ckpt, local_greedy):
    # The first prompt asks for the capital of France: the shipped model knows it.
    assert "Paris" in ckpt.tokenizer.decode(local_greedy[0])


def test_hf_checkpoint_directory_loads(ckpt, full_model, chat_prompts, tmp_path):
    """A plain Hugging Face Llama directory (safetensors + config + tokenizer) loads too."""
    from veil.engine.loader import build_model, load_checkpoint

    ref = build_reference(ckpt)
    ref.save_pretrained(tmp_path)
    ckpt.tokenizer.save_pretrained(tmp_path)
    other = load_checkpoint(tmp_path)
    assert other.config.num_layers == ckpt.config.num_layers
    assert other.config.eos_token_ids == ckpt.config.eos_token_ids
    assert other.tensors["lm_head.weight"] is other.tensors["model.embed_tokens.weight"]  # tied, as from the GGUF
    model = build_model(other)
    ids = chat_prompts[0]
    with torch.inference_mode():
        a, _ = model.forward_layers(model.embed(torch.tensor(ids)), torch.arange(len(ids)), [None] * 30)
        b, _ = full_model.forward_layers(full_model.embed(torch.tensor(ids)), torch.arange(len(ids)), [None] * 30)
        assert torch.equal(model.logits(a), full_model.logits(b))
    assert other.tokenizer.encode("Paris is nice") == ckpt.tokenizer.encode("Paris is nice")
