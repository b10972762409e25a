"""What the test suites share: constants (:mod:`.constants`), small policy builders
(:mod:`.policies`), hypothesis strategies (:mod:`.strategies`), the upstream oracle
(:mod:`.upstream`), golden files (:mod:`.golden`), and the helpers more than one test module uses.
Nothing here is a test; no test module imports another test module's names."""
