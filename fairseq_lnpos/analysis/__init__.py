"""Gradient statistics at initialization (Fig. 3) and Lemma 2 norms; see init_grad.py."""
