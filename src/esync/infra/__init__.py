"""Infrastructure every part uses: the clock and its slowdown, stop criteria, readiness lines, `module:function` plug-ins, the console's one-line errors, the state server's HTTP client."""
