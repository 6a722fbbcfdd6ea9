"""The pytest face: the session object (plan → items → evaluation → gathered records), resume and --lf records, the terminal summary."""
