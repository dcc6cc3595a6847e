"""One request from parsed body to upstream exchange: features, cache lookup, admission, retries."""
