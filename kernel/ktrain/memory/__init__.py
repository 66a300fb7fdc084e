"""The memory model of one rank: parameters, gradients, optimizer states, buffers, activations and logits.

``shape`` reads a decoder's config.json; ``parts`` is the vocabulary plugins answer
``ktrain_collect_memory`` with; ``defaults`` the kernel's own answers; ``activations`` what blocks save;
``model.predict`` puts them together for a checked plan. Nothing here imports torch but ``measure``,
which counts what a real run holds for ``ktrain plan --measure``.
"""
