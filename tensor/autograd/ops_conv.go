package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// Convolution and pooling, recorded as PyTorch records them.

// Conv2d is torch.nn.functional.conv2d: ATen's conv2d (an unbatched 3-D
// input is unsqueezed to a batch of one and the result squeezed back)
// over at::convolution, whose node ConvolutionBackward0 saves input and
// weight (derivatives.yaml: one formula for input, weight and bias, so
// both are saved whenever the node exists). Its backward is
// convolution_backward with output_mask from the inputs that need a
// gradient: grad_input, grad_weight, grad_bias allocated in that order.
// The cuDNN workspace is not modelled (tensor.Conv2d).
func Conv2d(x, w, bias *tensor.Tensor, p tensor.ConvParams) (*tensor.Tensor, error) {
	release, err := castArgs(lowerPrecision, &x, &w, &bias)
	if err != nil {
		return nil, err
	}
	defer release()
	if d := x.Dim(); d != 3 && d != 4 {
		return nil, fmt.Errorf("Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: %v", fmtSizes(x.Shape()))
	}
	if x.Dim() == 3 {
		x4, err := Unsqueeze(x, 0)
		if err != nil {
			return nil, err
		}
		out, err := convolution(x4, w, bias, p)
		if err != nil {
			return nil, err
		}
		return Squeeze(out, []int{0})
	}
	return convolution(x, w, bias, p)
}

func convolution(x, w, bias *tensor.Tensor, p tensor.ConvParams) (*tensor.Tensor, error) {
	n := newNode("ConvolutionBackward0", x, w, bias)
	var sx, sw *SavedTensor
	if n != nil {
		sx = n.save(x)
		sw = n.save(w)
	}
	out, err := tensor.Conv2d(x, w, bias, p)
	if err != nil || n == nil {
		return out, err
	}
	hasBias := bias != nil
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		xv, err := sx.Unpack()
		if err != nil {
			return nil, err
		}
		wv, err := sw.Unpack()
		if err != nil {
			return nil, err
		}
		mask := [3]bool{n.needsGrad(0), n.needsGrad(1), hasBias && n.needsGrad(2)}
		gi, gw, gb, err := tensor.Conv2dBackward(g[0], xv, wv, p, mask)
		if err != nil {
			return nil, err
		}
		return []*tensor.Tensor{gi, gw, gb}, nil
	}
	n.setOutputs(out)
	return out, nil
}

// MaxPool2d is torch.nn.functional.max_pool2d through
// max_pool2d_with_indices (MaxPool2DWithIndicesBackward0 saves self and
// the int64 indices, result1); it returns the output and the indices (the
// indices are dropped by the caller unless return_indices). The backward
// allocates one input-sized gradient.
func MaxPool2d(x *tensor.Tensor, p tensor.PoolParams) (out, idx *tensor.Tensor, err error) {
	n := newNode("MaxPool2DWithIndicesBackward0", x)
	var sx *SavedTensor
	if n != nil {
		sx = n.save(x)
	}
	out, idx, err = tensor.MaxPool2dWithIndices(x, p)
	if err != nil || n == nil {
		return out, idx, err
	}
	n.setOutputs(out)
	si := n.saveOutput(idx, 1)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		xv, err := sx.Unpack()
		if err != nil {
			return nil, err
		}
		iv, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		gi, err := tensor.MaxPool2dBackward(g[0], xv, iv)
		return []*tensor.Tensor{gi}, err
	}
	return out, idx, nil
}

// BatchNorm is torch.nn.functional.batch_norm as PyTorch 2.x dispatches
// it (tensor.BatchNorm): through cuDNN (CudnnBatchNormBackward0: saves
// input, weight, running_mean, running_var, save_mean, save_var and the
// reserve space; the backward in training is cudnn_batch_norm_backward,
// which allocates grad_input, grad_weight and grad_bias whatever needs
// them) or native_batch_norm (NativeBatchNormBackward0: saves input,
// weight, running_mean, running_var, save_mean, save_invstd; the backward
// allocates what the inputs need). Evaluation-mode backward is
// native_batch_norm_backward in both cases.
func BatchNorm(x, w, b, rm, rv *tensor.Tensor, training bool, momentum, eps float64) (*tensor.Tensor, error) {
	cudnn := tensor.BatchNormCudnn(x, w, b, rm, rv, training)
	name := "NativeBatchNormBackward0"
	if cudnn {
		name = "CudnnBatchNormBackward0"
	}
	n := newNode(name, x, w, b)
	var sx, sw, srm, srv *SavedTensor
	if n != nil {
		sx, sw, srm, srv = n.save(x), n.save(w), n.save(rm), n.save(rv)
	}
	out, sm, sv, reserve, err := tensor.BatchNorm(x, w, b, rm, rv, training, momentum, eps)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	ssm, ssv := n.saveOutput(sm, 1), n.saveOutput(sv, 2)
	if cudnn {
		n.saveOutput(reserve, 3)
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		var vs [6]*tensor.Tensor
		for i, s := range []*SavedTensor{sx, sw, srm, srv, ssm, ssv} {
			v, err := s.Unpack()
			if err != nil {
				return nil, err
			}
			vs[i] = v
		}
		mask := [3]bool{n.needsGrad(0), n.needsGrad(1), n.needsGrad(2)}
		gi, gw, gb, err := tensor.BatchNormBackward(g[0], vs[0], vs[1], vs[2], vs[3], vs[4], vs[5], training, eps, mask, cudnn)
		if err != nil {
			return nil, err
		}
		return []*tensor.Tensor{gi, gw, gb}, nil
	}
	return out, nil
}

// fmtSizes formats a shape as ATen's IntArrayRef: "[4, 4]".
func fmtSizes(shape []int) string {
	s := "["
	for i, d := range shape {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(d)
	}
	return s + "]"
}
