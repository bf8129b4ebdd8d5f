"""The misuse tests' check that a call raises: the error type, and every needle in its message."""


def expect_raises(failures, fn, error, needles):
    """fn() raises `error` with a message containing every needle; otherwise a line in failures."""
    try:
        fn()
    except error as e:
        for needle in needles:
            if needle not in str(e):
                failures.append(f"message '{e}' lacks '{needle}'")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"{type(e).__name__} instead of {error.__name__}: {e}")
        return
    failures.append(f"no error (expected {error.__name__} mentioning {needles})")
