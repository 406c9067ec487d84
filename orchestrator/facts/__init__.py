"""Facts: pure builders of remote argv lists and pure parsers of what hosts print.

Nothing here runs anything; operations hand these argv lists to a runner and its output back here.
"""
