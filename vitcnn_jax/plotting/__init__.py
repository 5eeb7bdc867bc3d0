"""Figures in the style of the paper's, a module per analysis they serve.

Drawn on `axes.Figure`, a `matplotlib.figure.Figure` made without pyplot (no backend
chosen here): importing them changes nothing in a notebook's session, and a returned
Figure displays there.
How figures are written (`style.Figures`) is an argument, never module state.
"""
