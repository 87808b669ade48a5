"""The simulator's error answers, shaped (status, type, message, param) as vLLM 0.32.0's."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the server answers with a vLLM-style JSON error body."""

    def __init__(self, status: int, error_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


def invalid_parameter(message: str, parameter: str, value: object = None) -> ApiError:
    """vLLM's 400 for a well-typed field with a bad value: the message names the field (and value)."""
    suffix = f"parameter={parameter}" if value is None else f"parameter={parameter}, value={value}"
    return bad_request(f"{message} ({suffix})", parameter)


def model_not_found(model: str, base_names: tuple[str, ...]) -> ApiError:
    aliases = ", ".join(base_names)
    return ApiError(
        404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model"
    )
