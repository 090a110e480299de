"""Model: the Linen networks, their losses, the prior and the class transport."""
