# screen.py -- python screen.py VARIANT [pretrain.py flags]: pretrain.py with one change that has no flag yet
import sys
import torch
import pretrain

variant, argv = sys.argv[1], sys.argv[2:]
if variant == "b2":                                  # Adam's beta2 0.98
    pretrain.ADAM["betas"] = (0.9, 0.98)
elif variant == "wsd":                               # the peak rate held to half-way, then linear to 0
    old_lr = pretrain.get_lr
    def get_lr(step, lr=1e-4, warmup=30000, init_lr=1e-7, schedule="inverse_sqrt", max_steps=None):
        hold = max_steps // 2
        if schedule == "linear" and step >= warmup:
            return lr if step < hold else lr * max(0.0, (max_steps - step) / max(max_steps - hold, 1))
        return old_lr(step, lr, warmup, init_lr, schedule, max_steps)
    pretrain.get_lr = get_lr
elif variant.startswith("split"):                    # split2000: 8-token streams for the first 2,000 updates
    n, old_next = int(variant[5:]), pretrain.next_micro_batch
    def next_micro_batch(run, update=None):
        lang, (inputs, targets, where, offset) = old_next(run, update)
        if run.step < n:                             # (B, 16) -> (2B, 8): the flat order, so `where`, is kept
            B, T = inputs.shape
            inputs, targets = inputs.reshape(2 * B, T // 2), targets.reshape(2 * B, T // 2)
            offset = torch.stack([offset, offset + T // 2], 1).reshape(-1)
        return lang, (inputs, targets, where, offset)
    pretrain.next_micro_batch = next_micro_batch
elif variant.startswith("offs0"):                    # offs02000 (slice 4): no --pos-offsets for ~2,000 updates
    n, old_next = int(variant[5:]), pretrain.next_micro_batch
    def next_micro_batch(run, update=None):          # run.step when drawn: one update ahead (2,001 updates at 0)
        saved, run.args.pos_offsets = run.args.pos_offsets, (run.args.pos_offsets if run.step >= n else 0)
        try:
            return old_next(run, update)
        finally:
            run.args.pos_offsets = saved
    pretrain.next_micro_batch = next_micro_batch
pretrain.main(argv)                                  # other variants (w2k, ad0, bptt8, snap, do0): flags only
