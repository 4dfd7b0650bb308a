"""The vcuda admission webhook: validates vcuda requests and rewrites pods."""
