"""``ktrain bench CONFIG``: the training step of a config, timed on one device or on N ranks, beside plain Hugging Face.

The run is built as ``ktrain run`` builds it: the same plugins and hooks load, wrap, parallelize and
shard the model and build the optimizer and schedule, and every step is the loop's own
``Trainer._train_step`` (``trainer``). Left out are the loop's observers (logging, evaluation,
checkpoints, export, the ``on_*`` hooks). One process (world size 1), or N ranks with ``--nproc-per-node``
(``ranks``, each rank calling ``measure.measure``); the run directory is a temporary folder, removed at the
end, so nothing is written to ``output_dir`` (``command``).

Rows (``rows``): random tokens, ``micro_batch_size`` rows of ``sequence_len`` tokens per micro-batch, every
token trained, with ``--synthetic`` or when the config has no ``datasets`` (the config check's demand for
``datasets`` is then met by an entry naming the temporary run directory, which nothing reads, and no
tokenizer is loaded);
with ``--lengths MEDIAN:MAX`` random-token samples of log-normal lengths, packed into rows under
``sample_packing`` and given to the peer one a row, padded to the longest of its micro-batch
(``--peer-micro-batch``): tokens/s then counts real tokens, not padding; otherwise the config's data,
tokenized into the temporary run directory (or ``dataset_prepared_path``).

With ``--pairs PROMPT:ANSWER`` (a preference config, ``rl``) the rows are random-token pairs, each a prompt
and two answers in the sample layout of a preference format (``rows.PairRows``); ``--peer trl`` then times
TRL's ``DPOTrainer`` on the same pairs first (``trl_peer``; trl is imported only then). Under a config's
``precompute_ref_log_probs`` the pairs are written as the preprocessing cache the pass before training reads, and
that pass (an objective's ``passes``; TRL's ``_precompute_ref_logps``) is reported apart from the steps. With
``--peer axolotl``
Axolotl itself trains the same YAML first, in a subprocess, and its log gives its side (``axolotl_peer``).

With ``--peer hf`` the plain Hugging Face step (``peer``) runs first, on the same rows, and is freed
before the ktrain side is built: it runs first because plugins such as Liger patch the architecture's
modules for the whole process. Each side's peak memory is the GPU's peak allocation from the start of
its build to the end of its timed steps (``timing``; the GPU's clock and power meanwhile: ``device``).

MFU counts ``6 · N + 12 · layers · hidden · sequence_len`` training FLOPs a token (N: the parameters
outside the input embeddings, ZeRO-3 partitions counted whole) against the device's dense bf16 peak
(``ktrain.run.metrics.PEAK_TFLOPS``; ``KTRAIN_PEAK_TFLOPS`` overrides; none on a CPU). ``report`` prints it.
"""
