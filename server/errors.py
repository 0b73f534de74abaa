"""The one error type handlers raise: a status, a stable code and a human message, rendered as
`{"error": {"code", "message"}}`."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message, self.headers)


def error_response(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    # "type" mirrors OpenAI's error object, so OpenAI clients show the message too.
    return JSONResponse({"error": {"code": code, "message": message, "type": code}}, status_code=status,
                        headers=headers)
