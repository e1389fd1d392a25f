"""`with` support and a best-effort close() when the object is collected, for the client's
resource-holding classes (each defines close(), safe to call more than once)."""


class ClosesOnExit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
