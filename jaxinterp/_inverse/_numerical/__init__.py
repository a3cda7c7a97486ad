"""The numerical methods of `inverse`: an elementwise root finder and the
methods built on it.

The exact methods (rules, blocks solved piecewise, linearly or by rational
forms) never import this package; the engine loads it the first time a
method here is tried, so `import jaxinterp` and maps inverted exactly do not
pay for it. It holds the elementwise solver (`_solve`, with its grid,
`_grid`, its table of starts, `_table`, and its lazily gathered later tiers,
`_lazy`), the analyses that decide where a map is injective (`_turning`, and
the slope enclosures of `_enclose*`), the numerical solve of a block
(`_block_numeric`), and two methods of the engine's table: triangular maps
(`_sequential`) and maps through a scalar bottleneck (`_bottleneck`, with the
sign analysis of `_signs`).
"""
