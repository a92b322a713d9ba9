"""The vocabulary shortlist: built from training pairs, carried by the tokenizer (and so by
every checkpoint), and applied by --shortlist: per few sentences on a single model, whose steps
then score only their lists' columns; per batch, masked, where a constraint needs the whole
vocabulary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.checkpoint.directory import load_checkpoint, save_checkpoint
from aiayn.config import Config, DataConfig, DecodeConfig, ModelConfig
from aiayn.data.prepare import load_tokenizer, prepare_data
from aiayn.errors import ConfigError
from aiayn.inference import engine as engine_module
from aiayn.inference.phrase_constraints import PhraseConstraint
from aiayn.inference.quantize import Int8Linear
from aiayn.inference.search import SearchInputs, search
from aiayn.inference.step_vocabulary import BatchVocabulary, SentenceVocabulary, shortlist_dtype, sliced_projection
from aiayn.inference.translator import Translator
from aiayn.model import build_model
from aiayn.text.shortlist import Shortlist, build_shortlist
from aiayn.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SRC = ["a small dog runs", "the red house", "two men play football in the park", "hello there",
       "a red dog", "the small house", "two dogs play", "men run in the park"] * 6
TGT = ["ein kleiner hund rennt", "das rote haus", "zwei männer spielen fußball im park", "hallo da",
       "ein roter hund", "das kleine haus", "zwei hunde spielen", "männer rennen im park"] * 6


def test_build_shortlist_golden():
    # ids: 0-3 specials; source pieces 4, 5, 6; target pieces 4..8.
    pairs = [([4, 5, 3], [4, 5]), ([4, 6, 3], [4, 6]), ([5, 3], [5, 7]), ([4, 3], [4, 8])]
    sl = build_shortlist(pairs, src_vocab=7, tgt_vocab=9, k=2, frequent=2)
    # Dice(s, t) = 2 cooc / (df(s) + df(t)); df src: 4->3, 5->2, 6->1; df tgt: 4->3, 5->2, 6,7,8->1.
    # s=4: t4 2*3/6=1.0, t5 2/5, t6 2/4, t8 2/4 -> [4, 6] (6 before 8: the lower id among equals).
    # s=5: t5 2*2/4=1.0, t7 2/3, t4 2/5 -> [5, 7]; s=6: t6 2/2, t4 2/4 -> [6, 4].
    assert sl.table.tolist() == [[-1, -1]] * 4 + [[4, 6], [5, 7], [6, 4]]
    assert sl.frequent.tolist() == [4, 5]  # target counts: 4 x3, 5 x2, then 6, 7, 8 once
    assert sl.rows([5, 3, 0]).tolist() == [EOS_ID, 4, 5, 7]
    assert sl.rows([6], extra=[8]).tolist() == [EOS_ID, 4, 5, 6, 8]
    # Lists of two sentences each, the special ids first (column = id), padded with PAD.
    lists, sizes = sl.sentence_rows(torch.tensor([[5, 3], [6, 3], [4, 3]]), extras=[[], [8], []], group=2)
    assert lists.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 0, 0]]
    assert sizes.tolist() == [9, 7]
    back = Shortlist.from_bytes(sl.to_bytes())
    assert torch.equal(back.table, sl.table) and torch.equal(back.frequent, sl.frequent)


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("shortlist")
    cfg = DataConfig(train_src=_write(tmp / "t.en", SRC), train_tgt=_write(tmp / "t.de", TGT), vocab_size=70,
                     shortlist_k=3, shortlist_frequent=4)
    summary = prepare_data(cfg, tmp / "prepared", progress=False)
    assert summary["shortlist"] == {"k": 3, "frequent": 4}
    return tmp / "prepared"


def _config(tok, output_bias: bool = True) -> Config:
    return Config(model=ModelConfig(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
                                    src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    max_positions=64, share_embeddings="none", output_bias=output_bias))


def _model(tok, seed: int = 0, output_bias: bool = True):
    torch.manual_seed(seed)
    model = build_model(_config(tok, output_bias).model)
    if output_bias:
        with torch.no_grad():
            model.output_bias.normal_()
    return model


def _tiny_output_model(vocab: int, output_bias: bool):
    return build_model(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=8, n_heads=2, d_ff=16,
                                   n_encoder_layers=1, n_decoder_layers=1, output_bias=output_bias))


def test_prepare_builds_it_and_checkpoints_carry_it(prepared, tmp_path):
    tok = load_tokenizer(prepared)
    assert tok.shortlist is not None and tok.shortlist.table.shape == (tok.src_vocab_size, 3)
    ckpt = save_checkpoint(tmp_path / "ckpt", _model(tok), _config(tok), tok)
    again = load_checkpoint(ckpt).tokenizer
    assert torch.equal(again.shortlist.table, tok.shortlist.table)
    # Prepared again without it: none (a reused tokenizer's is dropped).
    cfg = DataConfig(train_src=str(prepared.parent / "t.en"), train_tgt=str(prepared.parent / "t.de"),
                     vocab_size=70)
    prepare_data(cfg, prepared.parent / "plain", progress=False)
    assert load_tokenizer(prepared.parent / "plain").shortlist is None


@pytest.fixture
def float32_lists(monkeypatch):
    """Per-sentence lists projected in float32 on every CPU (bf16 where it is native otherwise)."""
    monkeypatch.setattr("aiayn.inference.step_vocabulary.shortlist_dtype", lambda weight: torch.float32)


def test_a_shortlist_of_the_whole_vocabulary_changes_nothing(prepared, float32_lists):
    tok = load_tokenizer(prepared)
    v = tok.tgt_vocab_size
    tok.shortlist = Shortlist(torch.arange(v).repeat(tok.src_vocab_size, 1), torch.arange(v))
    tr = Translator(_model(tok), tok, Config(), dtype="fp32")
    texts = SRC[:8]
    for beam in (1, 4):
        full = tr.translate_detailed(texts, nbest=beam, beam=beam, max_len_b=8)
        short = tr.translate_detailed(texts, nbest=beam, beam=beam, max_len_b=8, shortlist=True)
        assert [[h.tokens for h in r.hypotheses] for r in full] == [[h.tokens for h in r.hypotheses] for r in short]
        assert [h.score for r in full for h in r.hypotheses] == pytest.approx(
            [h.score for r in short for h in r.hypotheses], rel=1e-5)


def _vocabularies(tr, tok, texts, prefix=()):
    """The narrowing vocabulary of ``texts`` (one list for all, with the ``prefix`` ids) and the
    masking one over the same list, with their source batch."""
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(tok.encode_src(t)) for t in texts], batch_first=True)
    lists, sizes = tok.shortlist.sentence_rows(src, extras=prefix, group=len(texts))
    narrow = SentenceVocabulary(tr.model, lists, sizes, tok.tgt_vocab_size, dtype=torch.float32,
                                sentences_per_list=len(texts))
    return narrow, BatchVocabulary(lists[0, :int(sizes[0])], tok.tgt_vocab_size), src


@pytest.mark.parametrize("beam, ngram", [(1, 2), (4, 2), (4, 1)])
def test_narrowed_steps_search_as_the_masked_vocabulary_does(prepared, beam, ngram):
    """Scores over a list's columns (ids != columns) give the search the same hypotheses as the
    whole vocabulary with every other id at -inf: the column map, the forced prefix and the
    n-gram ban in columns included."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, seed=3), tok, Config())
    texts = ["two men play football in the park", "a red dog"]
    prefix = [tok.encode_tgt("zwei"), []]
    narrow, masked, src = _vocabularies(tr, tok, texts, prefix)
    assert narrow.lists.size(1) < tok.tgt_vocab_size
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_b=10, no_repeat_ngram_size=ngram)
    got = search(tr.decoder, src, cfg, SearchInputs(prefix=prefix, vocabulary=narrow))
    want = search(tr.decoder, src, cfg, SearchInputs(prefix=prefix, vocabulary=masked))
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps],
                                                                    rel=1e-5)
    assert got[0][0].tokens[:len(prefix[0])] == prefix[0]


def test_narrowed_steps_force_special_ids_as_the_masked_vocabulary_does(prepared):
    """A forced id is found in its row's list whatever it is, the special ids (columns = ids)
    included."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, seed=3), tok, Config())
    prefix = [[PAD_ID, UNK_ID], [UNK_ID, PAD_ID]]
    narrow, masked, src = _vocabularies(tr, tok, ["a red dog", "hello there"], prefix)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_b=6)
    narrowed = search(tr.decoder, src, cfg, SearchInputs(prefix=prefix, vocabulary=narrow))
    got = [[h.tokens for h in hyps] for hyps in narrowed]
    want = search(tr.decoder, src, cfg, SearchInputs(prefix=prefix, vocabulary=masked))
    assert got == [[h.tokens for h in hyps] for hyps in want]
    assert [hyps[0][:2] for hyps in got] == prefix


def test_narrowed_steps_follow_rows_that_leave_and_differ_in_number(prepared):
    """Each row scores its own list's columns, whatever rows are left: several rows of one
    sentence and one of another (the padded layout), sentences dropped until the weights are
    gathered again."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, seed=3), tok, Config())
    texts = ["two men play football in the park", "a red dog", "hello there", "the small house"]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(tok.encode_src(t)) for t in texts], batch_first=True)
    lists, sizes = tok.shortlist.sentence_rows(src, group=1)
    vocab = SentenceVocabulary(tr.model, lists, sizes, tok.tgt_vocab_size, dtype=torch.float32)
    state = tr.decoder.init_state(src, 8)
    vocab.start(src.size(0))
    reference = tr.decoder.init_state(src, 8)

    def check(tokens, sentences):
        scores, _ = tr.decoder.step(tokens, state, vocabulary=vocab)
        full, _ = tr.decoder.step(tokens, reference)
        for row, sent in enumerate(sentences):
            n = int(sizes[sent])
            assert torch.allclose(scores[row, :n], full[row, lists[sent, :n]], atol=1e-5)
            assert torch.isneginf(scores[row, n:]).all()
            cols = torch.arange(n)
            assert torch.equal(vocab.ids(torch.full((n,), row), cols), lists[sent, :n])

    with torch.no_grad():
        check(torch.full((4,), BOS_ID), [0, 1, 2, 3])
        index = torch.tensor([0, 0, 1, 2])  # two rows of sentence 0, one of 1 and 2: 3 of 4 lists left
        state = tr.decoder.reorder(state, index)
        vocab.select(index)
        reference = tr.decoder.reorder(reference, index)
        assert vocab.pos is not None and vocab.held.tolist() == [0, 1, 2, 3]
        check(torch.tensor([5, 6, 7, 5]), [0, 0, 1, 2])
        index = torch.tensor([1, 0])  # two rows of sentence 0: under 3/4 of the lists held
        state = tr.decoder.reorder(state, index)
        vocab.select(index)
        reference = tr.decoder.reorder(reference, index)
        assert vocab.held.tolist() == [0] and vocab.pos is None
        check(torch.tensor([8, 9]), [0, 0])
        assert vocab.columns(torch.tensor([0, 1]), lists[0, 5:7]).tolist() == [5, 6]
        absent = next(i for i in range(tok.tgt_vocab_size) if i not in set(lists[0].tolist()))
        assert vocab.columns(torch.tensor([0]), torch.tensor([absent])).tolist() == [0]


class MaskedVocabulary:
    """The reference a shortlist must equal: the whole vocabulary's step, with every id
    outside the row's sentence's allowed set at -inf (allowed: (B, V) bools), the search
    normalizing the logits as always."""

    normalized = False

    def __init__(self, inner, allowed: torch.Tensor) -> None:
        self.inner, self.allowed, self.max_steps = inner, allowed, inner.max_steps

    def init_state(self, src, max_steps):
        return self.inner.init_state(src, max_steps), torch.arange(src.size(0))

    def reorder(self, state, index, same_sources=False):
        inner, sentence = state
        return self.inner.reorder(inner, index, same_sources=same_sources), sentence.index_select(0, index)

    def step(self, tokens, state, need_attn=False, vocabulary=None):
        assert vocabulary is None  # the reference scores the whole vocabulary, then masks it
        inner, sentence = state
        logits, attn = self.inner.step(tokens, inner, need_attn)
        return logits.masked_fill(~self.allowed[sentence], float("-inf")), attn


def _allowed(lists: torch.Tensor, sizes: torch.Tensor, vocab: int, per_list: int = 1) -> torch.Tensor:
    """(B, V) bools: sentence b may emit the ids of list b // per_list."""
    allowed = torch.zeros(len(lists) * per_list, vocab, dtype=torch.bool)
    for b in range(len(allowed)):
        allowed[b, lists[b // per_list, :int(sizes[b // per_list])]] = True
    return allowed


def _outputs(hyps):
    return [[h.tokens for h in per_sent] for per_sent in hyps], [h.log_prob for per_sent in hyps for h in per_sent]


@pytest.mark.parametrize("cfg", [DecodeConfig(sampling=True, beam=3, nbest=3, max_len_b=10, seed=1),
                                 DecodeConfig(beam=1, max_len_b=10)], ids=["sampling", "greedy"])
def test_sampling_and_greedy_draw_as_the_masked_vocabulary_does(prepared, cfg):
    """Each sentence's list: the same tokens and log-probabilities as the whole vocabulary
    with every id outside that sentence's list at -inf (a sampled draw over the list's columns
    is the same draw as over the masked vocabulary: the list is sorted by id)."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, seed=3), tok, Config())
    texts = SRC[:6]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(tok.encode_src(t)) for t in texts], batch_first=True)
    lists, sizes = tok.shortlist.sentence_rows(src, group=1)
    narrow = SentenceVocabulary(tr.model, lists, sizes, tok.tgt_vocab_size, dtype=torch.float32)
    masked = MaskedVocabulary(tr.decoder, _allowed(lists, sizes, tok.tgt_vocab_size))
    got, got_lp = _outputs(search(tr.decoder, src, cfg, SearchInputs(vocabulary=narrow)))
    assert all(len(per_sent) == cfg.nbest for per_sent in got)
    if cfg.sampling:  # draws over fewer columns differ: each draw is scored by the reference instead
        want_lp = [_log_prob(masked, src[b:b + 1], b, tokens) for b, per_sent in enumerate(got) for tokens in per_sent]
        assert all(set(tokens) <= set(lists[b, :int(sizes[b])].tolist())
                   for b, per_sent in enumerate(got) for tokens in per_sent)
    else:
        want, want_lp = _outputs(search(masked, src, cfg))
        assert got == want
    assert got_lp == pytest.approx(want_lp, rel=1e-5)
    unrestricted, _ = _outputs(search(tr.decoder, src, cfg))
    assert unrestricted != got  # a random model wanders outside the lists: the comparison bites


def _log_prob(masked: MaskedVocabulary, src: torch.Tensor, sentence: int, tokens: list[int]) -> float:
    """The reference's summed log-probability of ``tokens`` then EOS, for one source."""
    one = MaskedVocabulary(masked.inner, masked.allowed[sentence:sentence + 1])
    state = one.init_state(src, len(tokens) + 1)
    total = 0.0
    with torch.no_grad():
        for prev, nxt in zip([BOS_ID, *tokens], [*tokens, EOS_ID]):
            logits, _ = one.step(torch.tensor([prev]), state)
            total += float(torch.log_softmax(logits.float(), dim=-1)[0, nxt])
    return total


def test_the_projection_runs_in_bf16_where_it_is_native(monkeypatch):
    weight = torch.zeros(3, 2)
    monkeypatch.setattr("aiayn.inference.step_vocabulary.native_bf16", lambda device: True)
    assert shortlist_dtype(weight) == torch.bfloat16
    monkeypatch.setattr("aiayn.inference.step_vocabulary.native_bf16", lambda device: False)
    assert shortlist_dtype(weight) == torch.float32


def test_a_constraint_keeps_the_whole_vocabulary(prepared):
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok), tok, Config())
    narrow, _, src = _vocabularies(tr, tok, ["hello there"])
    with pytest.raises(ValueError, match="a constraint masks the whole vocabulary: it cannot drive steps that "
                                         "narrow it"):
        search(tr.decoder, src, DecodeConfig(),
               SearchInputs(constraint=PhraseConstraint([[[5]]], [[]], eos=EOS_ID), vocabulary=narrow))


@pytest.mark.parametrize("output_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_a_single_model_projects_onto_the_shortlist_rows_only(prepared, dtype, output_bias):
    """The saving: the step's projection has as many columns as the list, in every dtype, and
    the whole vocabulary's projection does not run."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, output_bias=output_bias), tok, Config(), dtype=dtype)
    rows = tok.shortlist.rows(tok.encode_src(SRC[0]))
    vocab = BatchVocabulary(rows, tok.tgt_vocab_size)
    src = torch.tensor([tok.encode_src(SRC[0])])
    bos = torch.tensor([BOS_ID])
    whole_projections = []
    tr.decoder.project.register_forward_hook(lambda module, args, out: whole_projections.append(out.shape))
    with torch.no_grad():
        full, _ = tr.decoder.step(bos, tr.decoder.init_state(src, 4))
        assert len(whole_projections) == 1
        short, _ = tr.decoder.step(bos, tr.decoder.init_state(src, 4), vocabulary=vocab)
    assert len(whole_projections) == 1  # the cut projection ran instead
    kept = torch.isfinite(short[0]).nonzero()[:, 0]
    assert kept.tolist() == rows.tolist()
    # The same scores as the full projection's on those rows (int8: per-row quantization). A
    # float32 GEMM over fewer columns may block its sums differently (AMX CPUs do): equal to
    # float32 rounding, while a wrong row is off by the scores' own size.
    if dtype == "fp32":
        torch.testing.assert_close(short[0, rows], full[0, rows], rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(short[0, rows], full[0, rows].to(short.dtype))
    # The step ran the projection cut to the rows: an int8 layer of the rows' weights, or the
    # float projection's columns of the rows.
    sliced = sliced_projection(tr.decoder, rows)
    if dtype == "int8":
        assert isinstance(sliced, Int8Linear)
    else:
        assert sliced is not None and not isinstance(sliced, Int8Linear)
        assert tuple(sliced.weight_t.shape) == (tr.model.output_weight.size(1), len(rows))
    assert (sliced.bias is None) is not output_bias
    assert type(vocab._sliced[id(tr.decoder)]) is type(sliced)


def test_an_int8_projection_is_cut_with_its_own_kernel():
    weight = torch.randn(6, 8)
    for kernel in ("onednn", "int_mm"):
        decoder = SimpleNamespace(project=Int8Linear(weight, kernel=kernel),
                                  model=SimpleNamespace(output_weight=weight, output_bias=None))
        sliced = sliced_projection(decoder, torch.tensor([1, 4]))
        assert isinstance(sliced, Int8Linear) and sliced.kernel == kernel


def test_a_projection_that_cannot_be_cut_is_restricted_to_the_rows():
    """Any other projection (an ensemble's, a compiled step's) runs whole; its logits keep their
    values on the rows, every other id gets -inf."""
    torch.manual_seed(0)
    project = torch.nn.Linear(4, 6)
    decoder = SimpleNamespace(project=project, model=None)
    vocab = BatchVocabulary(torch.tensor([0, 2, 5]), 6)
    h = torch.randn(3, 4)
    with torch.no_grad():
        got, logits = vocab.project(h, decoder), project(h)
    assert torch.equal(got[:, [0, 2, 5]], logits[:, [0, 2, 5]])
    assert torch.isneginf(got[:, [1, 3, 4]]).all()


def test_the_search_emits_what_the_masked_vocabulary_does(prepared, float32_lists):
    """translate_detailed with the shortlist: one sentence alone (its own list), and sentences
    batched (each few sharing the union of their lists), give the hypotheses and scores of a
    search over the whole vocabulary with every id outside that list at -inf."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok, seed=3), tok, Config())
    vocab = tok.tgt_vocab_size
    changed = 0
    for text in SRC[:8]:
        src = torch.tensor([tok.encode_src(text)])
        lists, sizes = tok.shortlist.sentence_rows(src, group=1)
        assert int(sizes[0]) < vocab
        masked = MaskedVocabulary(tr.decoder, _allowed(lists, sizes, vocab))
        for beam in (1, 4):
            result = tr.translate_detailed([text], nbest=beam, beam=beam, max_len_b=10, shortlist=True)[0]
            want = search(masked, src, tr.decode_config(nbest=beam, beam=beam, max_len_b=10))[0]
            assert [h.tokens for h in result.hypotheses] == [h.tokens for h in want], (text, beam)
            assert [h.score for h in result.hypotheses] == pytest.approx([h.score for h in want], rel=1e-5)
            full = tr.translate_detailed([text], beam=beam, max_len_b=10)[0]
            changed += full.best.tokens != result.best.tokens
    assert changed  # the restriction bites: the comparison above tells a list from the vocabulary
    # A batch of several sentences: the union of the lists of those that share one.
    texts = SRC[:16]
    results = tr.translate_detailed(texts, beam=2, max_len_b=10, shortlist=True)
    order = sorted(range(len(texts)), key=lambda i: -len(tok.encode_src(texts[i])))  # the batch's order
    per = engine_module.SENTENCES_PER_LIST
    assert per > 1
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(tok.encode_src(texts[k])) for k in order], batch_first=True)
    lists, sizes = tok.shortlist.sentence_rows(src, group=per)
    want = search(MaskedVocabulary(tr.decoder, _allowed(lists, sizes, vocab, per)), src,
                  tr.decode_config(beam=2, max_len_b=10))
    assert [results[k].best.tokens for k in order] == [hyps[0].tokens for hyps in want]
    assert [results[k].best.score for k in order] == pytest.approx([hyps[0].score for hyps in want], rel=1e-5)


def test_forced_prefix_pieces_join_the_shortlist(prepared):
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok), tok, Config())
    result = tr.translate_detailed(["hello there"], prefixes=["zwei männer"], max_len_b=6, shortlist=True)[0]
    assert result.best.tokens[:len(tok.encode_tgt("zwei männer"))] == tok.encode_tgt("zwei männer")


def test_required_constraint_pieces_join_the_shortlist(prepared):
    """A required phrase outside the sentence's list is still placed: its pieces join the list."""
    tok = load_tokenizer(prepared)
    tr = Translator(_model(tok), tok, Config())
    allowed = set(tok.shortlist.rows(tok.encode_src("hello there")).tolist())
    phrase = next(w for w in ("fußball", "männer", "haus", "park")
                  if not set(tok.encode_tgt(w)) <= allowed)
    result = tr.translate_detailed(["hello there"], constraints=[[phrase]], max_len_b=8, shortlist=True)[0]
    pieces = tok.encode_tgt(phrase)
    tokens = result.best.tokens
    assert any(tokens[i:i + len(pieces)] == pieces for i in range(len(tokens)))


def test_no_shortlist_in_the_checkpoint_is_a_clear_error(prepared):
    tok = load_tokenizer(prepared)
    tok.shortlist = None
    with pytest.raises(ConfigError, match=r"^decode\.shortlist: the checkpoint has no vocabulary shortlist "
                                          r"\(prepare its data with data\.shortlist_k\)$"):
        Translator(_model(tok), tok, Config()).translate(["hello"], shortlist=True)


def test_prepare_command_line_builds_it(prepared, tmp_path):
    from aiayn.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--train-src", str(prepared.parent / "t.en"), "--train-tgt", str(prepared.parent / "t.de"),
              "--vocab-size", "70", "--shortlist-k", "2", "--shortlist-frequent", "1", "--out", str(tmp_path / "p"),
              "--quiet"])
    assert exc.value.code == 0
    sl = load_tokenizer(tmp_path / "p").shortlist
    assert sl is not None and sl.table.size(1) == 2 and len(sl.frequent) == 1


def test_ctranslate2_export_carries_it_as_a_vocabulary_map(prepared, tmp_path):
    """The shortlist becomes CTranslate2's vmap.txt; with full lists it changes nothing there
    either, and a real one keeps CTranslate2's output inside the lists too."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from aiayn.interop.ct2_translator import CTranslate2Translator
    from aiayn.interop.ctranslate2 import export_ctranslate2, vmap_text

    tok = load_tokenizer(prepared)
    lines = vmap_text(tok).splitlines()
    assert lines[0] == "\t" + " ".join(tok.tgt_pieces(tok.shortlist.frequent.tolist()))
    first = next(i for i, row in enumerate(tok.shortlist.table.tolist()) if row[0] >= 0)
    row = [t for t in tok.shortlist.table[first].tolist() if t >= 0]
    assert f"{tok.src_pieces([first])[0]}\t{' '.join(tok.tgt_pieces(row))}" in lines
    ckpt = save_checkpoint(tmp_path / "ckpt", _model(tok, seed=3), _config(tok), tok)
    ct2 = CTranslate2Translator(export_ctranslate2(ckpt, tmp_path / "ct2"), threads=1)
    assert (tmp_path / "ct2" / "vmap.txt").read_text(encoding="utf-8") == vmap_text(tok)
    outside = 0
    for text in SRC[:8]:
        allowed = set(tok.shortlist.rows(tok.encode_src(text)).tolist()) | {UNK_ID}  # CTranslate2 keeps <unk>
        best = ct2.translate_detailed([text], beam=2, max_len_b=10, shortlist=True)[0].best
        assert set(best.tokens) <= allowed, text
        outside += not set(ct2.translate_detailed([text], beam=2, max_len_b=10)[0].best.tokens) <= allowed
    assert outside  # without the map, the random model leaves the lists


def test_a_batch_vocabulary_restricts_whole_vocabulary_scores_exactly():
    """Logits keep their values on the rows; log-probabilities (an ensemble's, a compiled step's)
    are normalized again over the rows; every other id is -inf. A per-sentence vocabulary cannot
    restrict a step that scored the whole vocabulary."""
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 0.5, 0.0]])
    vocab = BatchVocabulary(torch.tensor([1, 3]), 5)
    inf = float("-inf")
    assert torch.equal(vocab.restrict(scores, normalized=False),
                       torch.tensor([[inf, 1.0, inf, 3.0, inf], [inf, 3.0, inf, 0.5, inf]]))
    renormed = vocab.restrict(scores.log_softmax(-1), normalized=True)  # over each row's kept ids
    assert torch.allclose(renormed[:, [1, 3]], torch.tensor([[1.0, 3.0], [3.0, 0.5]]).log_softmax(-1))
    assert torch.isinf(renormed[:, [0, 2, 4]]).all()
    lists, sizes = torch.tensor([[0, 1, 2, 3, 7]]), torch.tensor([5])
    narrow = SentenceVocabulary(_tiny_output_model(8, output_bias=False), lists, sizes, 8)
    with pytest.raises(ValueError, match=r"^per-sentence lists need a decoder that projects onto them \(a single "
                                         r"model, decoding eagerly\)$"):
        narrow.restrict(torch.zeros(1, 8), normalized=False)


@pytest.mark.parametrize("output_bias", [True, False], ids=["bias", "no-bias"])
def test_a_new_vocabulary_holds_every_list_in_its_precision(monkeypatch, output_bias):
    """Before a batch starts: every list held, no row laid out; the gathered rows of the output
    weight and bias in the projection's dtype (bf16 where native), -inf past each list's end."""
    torch.manual_seed(0)
    model = _tiny_output_model(10, output_bias)
    lists, sizes = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 0], [0, 1, 2, 3, 9]]), torch.tensor([5, 4, 5])
    monkeypatch.setattr("aiayn.inference.step_vocabulary.native_bf16", lambda device: True)
    vocab = SentenceVocabulary(model, lists, sizes, 10)
    assert vocab.dtype == torch.bfloat16 and vocab.weight.dtype == vocab.bias.dtype == torch.bfloat16
    assert vocab.held.tolist() == [0, 1, 2] and vocab.row_list.tolist() == []
    assert (vocab.slot, vocab.pos, vocab.rows_per_list) == (None, None, 1)
    assert torch.equal(vocab.weight, model.output_weight[lists].to(torch.bfloat16))
    bias = torch.zeros(3, 5) if model.output_bias is None else model.output_bias[lists]
    assert torch.equal(vocab.bias, bias.masked_fill(torch.tensor([[False] * 5, [False] * 4 + [True], [False] * 5]),
                                                    float("-inf")).to(torch.bfloat16))


@pytest.mark.parametrize("output_bias", [True, False], ids=["bias", "no-bias"])
def test_a_vocabulary_keeps_its_tensors_on_the_lists_device(output_bias):
    """Lists on an accelerator (here the meta device, which has shapes and no data), sizes from
    the CPU: every tensor the vocabulary makes is on the lists' device."""
    with torch.device("meta"):
        model = _tiny_output_model(10, output_bias)
    lists = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 9]], device="meta")
    vocab = SentenceVocabulary(model, lists, torch.tensor([5, 4]), 10, dtype=torch.float32)
    assert {name: getattr(vocab, name).device.type for name in ("lists", "weight", "bias", "held", "row_list")} == \
        dict.fromkeys(("lists", "weight", "bias", "held", "row_list"), "meta")
    vocab.slot = torch.tensor([1, 0], device="meta")  # as a layout of two rows sets it
    assert vocab.columns(torch.tensor([0, 1], device="meta"), torch.tensor([4, 9], device="meta")).device.type == "meta"


def test_many_narrow_lists_rows_out_of_order_and_no_rows_left():
    """More lists than columns, rows of several lists in any order, every row gone: each row's
    scores are its own list's columns, as the whole projection's on those ids."""
    torch.manual_seed(0)
    model = _tiny_output_model(12, output_bias=True)
    lists = torch.tensor([[0, 1, 2, 3, 4 + i] for i in range(6)])
    vocab = SentenceVocabulary(model, lists, torch.full((6,), 5), 12, dtype=torch.float32)
    weight, bias = model.output_weight.detach(), model.output_bias.detach()

    def check(row_lists: list[int]) -> None:
        h = torch.randn(len(row_lists), 8)
        with torch.no_grad():
            got = vocab.project(h, None)
        want = torch.stack([h[r] @ weight[lists[k]].T + bias[lists[k]] for r, k in enumerate(row_lists)])
        torch.testing.assert_close(got, want)

    vocab.start(6)
    assert vocab.pos is None  # one row per list, in order: the plain layout
    check([0, 1, 2, 3, 4, 5])
    assert vocab.columns(torch.tensor([0, 5, 5]), torch.tensor([4, 9, 4])).tolist() == [4, 4, 0]
    vocab.select(torch.tensor([3, 1, 1, 0, 5]))  # 4 of 6 lists left: gathered again; rows unsorted
    assert vocab.held.tolist() == [0, 1, 3, 5] and vocab.pos.tolist() == [0, 0, 1, 0, 0]
    check([3, 1, 1, 0, 5])
    assert vocab.ids(torch.tensor([0, 4]), torch.tensor([4, 4])).tolist() == [7, 9]
    vocab.select(torch.tensor([], dtype=torch.long))
    assert vocab.held.tolist() == [] and (vocab.pos, vocab.rows_per_list) == (None, 1)
