"""Flags that pin an older setup, so that an experiment measured under it still trains what
was measured after the defaults moved on."""

# The source's split: 10,000 digits held out for validation, evaluated every epoch.
SPLIT_50K = ["--validation-size", "10000", "--eval-every", "1"]
# The decoder's plain means, before images were rendered sharper.
PLAIN = ["--pixel-sharpness", "1"]
# The sampler before it fitted 30 components a class to posterior draws and truncated them.
MIXTURE_OF_MEANS = ["--prior-codes", "means", "--prior-components", "10", "--truncation", "1"]
# The default's setup of the 5-minute comparisons of 2026-11-25.
DEFAULT_50K = SPLIT_50K + PLAIN + MIXTURE_OF_MEANS
# M2 with shifts and consistency: `--preset semi` without virtual adversarial training.
SEMI_M2 = ["--labels", "100", "--classifier-weight", "5", "--classifier-shift", "2",
           "--consistency-weight", "20", *DEFAULT_50K]
# The 5-minute comparisons' scoring: IWAE K = 500 on the first 2,000 test digits (for ranking).
RANKING = ["--iwae-k", "500", "--iwae-limit", "2000", "--iwae-k-marginal", "10"]
# The published protocol: K = 5000 on all 10,000 test digits.
PUBLISHED = ["--iwae-k", "5000", "--iwae-k-marginal", "10"]
# Few labels: q(y|x)'s error and the samples, no bounds.
NO_BOUNDS = ["--iwae-k", "0", "--iwae-k-marginal", "0"]
